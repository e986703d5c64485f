//! Per-boundary head channels: subscriptions sleep until their boundary grows instead of
//! polling. The state machine publishes after every apply; any node's subscriptions follow
//! its own applied state.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cairn_store::Store;
use tokio::sync::watch;

/// Per-boundary `watch` channels of the head (number of events).
#[derive(Clone, Default)]
pub struct HeadWatch {
    senders: Arc<Mutex<HashMap<u32, watch::Sender<u64>>>>,
}

impl HeadWatch {
    /// A receiver for boundary `bid`, starting at its current head.
    pub fn subscribe(&self, store: &Store, bid: u32) -> watch::Receiver<u64> {
        let mut senders = self.senders.lock().unwrap_or_else(|p| p.into_inner());
        // Drop channels nobody listens to any more.
        senders.retain(|_, s| s.receiver_count() > 0);
        senders
            .entry(bid)
            .or_insert_with(|| watch::channel(store.event_count(bid)).0)
            .subscribe()
    }

    /// Publishes boundary `name`'s head after an apply.
    pub fn publish(&self, store: &Store, name: &str) {
        let Some(bid) = store.with_catalog(|c| c.boundaries.get(name).map(|b| b.id)) else {
            return;
        };
        let senders = self.senders.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(sender) = senders.get(&bid) {
            sender.send_replace(store.event_count(bid));
        }
    }

    /// Publishes every head (after a snapshot install replaced the state).
    pub fn publish_all(&self, store: &Store) {
        let senders = self.senders.lock().unwrap_or_else(|p| p.into_inner());
        for (bid, sender) in senders.iter() {
            sender.send_replace(store.event_count(*bid));
        }
    }
}
