//! openraft's storage conformance suite on Cairn's RocksDB log store and state machine.

use std::sync::Arc;

use cairn_raft::{HeadWatch, LogStore, NoObserver, StateMachine, StorageError, TypeConfig};
use cairn_store::{Store, StoreOptions};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{AnyError, StorageIOError};

struct RocksBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for RocksBuilder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError> {
        let io = |e: String| StorageError::from(StorageIOError::write(AnyError::error(e)));
        let dir = tempfile::tempdir().map_err(|e| io(e.to_string()))?;
        let store = Store::open(dir.path().join("db"), &StoreOptions::default())
            .map_err(|e| io(e.to_string()))?;
        let log = LogStore::new(store.db().clone()).map_err(|e| io(e.to_string()))?;
        let sm = StateMachine::new(
            store,
            dir.path().join("snapshots"),
            HeadWatch::default(),
            Arc::new(NoObserver),
        )
        .map_err(|e| io(e.to_string()))?;
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_suite() {
    if let Err(e) = Suite::test_all(RocksBuilder) {
        panic!("openraft storage suite failed: {e}");
    }
}
