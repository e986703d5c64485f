//! What a log entry carries: a command, with its encoding remembered once it is made.
//!
//! An entry's bytes are produced several times in a cluster: the leader encodes it for its
//! own log and once more for each follower's AppendEntries, and each follower, having
//! decoded it, encodes it again for its log. The bytes are the same every time, so the first
//! encoding (or, on a follower, the received bytes) is kept beside the command and copied
//! after that ([`crate::codec::encode_entry`], [`crate::codec::encode_append_entries`],
//! [`crate::codec::decode_append_entries`]). A proposal serialises exactly as its command
//! does, so the log and the wire keep their format. The command is shared, not copied, when
//! an entry is cloned: the log store hands the entries it appended to every replication
//! stream that reads them, not only to the first reader.

use std::sync::{Arc, OnceLock};

use cairn_core::command::Command;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::codec::CodecError;

/// A command in a log entry.
#[derive(Clone, Debug)]
pub struct Proposal {
    command: Arc<Command>,
    /// The command's postcard encoding, once made or received.
    encoded: OnceLock<Arc<[u8]>>,
}

impl Serialize for Proposal {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.command.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Proposal {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Command::deserialize(deserializer).map(Proposal::from)
    }
}

impl PartialEq for Proposal {
    fn eq(&self, other: &Self) -> bool {
        self.command == other.command
    }
}

impl From<Command> for Proposal {
    fn from(command: Command) -> Self {
        Proposal {
            command: Arc::new(command),
            encoded: OnceLock::new(),
        }
    }
}

impl Proposal {
    /// The command.
    pub fn command(&self) -> &Command {
        &self.command
    }

    /// The command's postcard encoding (made on the first call, copied after).
    pub fn encoded(&self) -> Result<&[u8], CodecError> {
        if let Some(bytes) = self.encoded.get() {
            return Ok(bytes);
        }
        let bytes: Arc<[u8]> = postcard::to_allocvec(&*self.command)?.into();
        Ok(self.encoded.get_or_init(|| bytes))
    }

    /// Remembers `bytes` as the command's encoding: they must be exactly what it was
    /// decoded from.
    pub(crate) fn remember(&self, bytes: &[u8]) {
        let _ = self.encoded.set(Arc::from(bytes));
    }

    /// Whether the encoding is known (tests).
    #[cfg(test)]
    pub(crate) fn is_encoded(&self) -> bool {
        self.encoded.get().is_some()
    }
}
