//! One call on behalf of every caller that asked before it started.
//!
//! A linearizable read needs a read index the leader has confirmed with a quorum *after*
//! the read arrived. Confirming it once per read costs a heartbeat round to every follower
//! (and, on a follower, a peer call to the leader) per read; under load those rounds are
//! most of a read's cost. Every caller waiting when a round starts is served by that round:
//! the round started after each of them arrived, so each gets a valid read index. Callers
//! that arrive while a round is in flight wait for the next one.

use std::future::Future;

use tokio::sync::{mpsc, oneshot};

type Waiter<K, T> = (K, oneshot::Sender<T>);

/// Shares calls of an async function among concurrent callers with the same key.
#[derive(Debug)]
pub struct Coalescer<K, T> {
    requests: mpsc::UnboundedSender<Waiter<K, T>>,
}

impl<K, T> Clone for Coalescer<K, T> {
    fn clone(&self) -> Self {
        Coalescer {
            requests: self.requests.clone(),
        }
    }
}

impl<K, T> Coalescer<K, T>
where
    K: Eq + Clone + Send + 'static,
    T: Clone + Send + 'static,
{
    /// Starts the task that owns the calls (it ends when every handle is dropped). Must be
    /// called inside a Tokio runtime.
    pub fn spawn<F, Fut>(mut call: F) -> Self
    where
        F: FnMut(K) -> Fut + Send + 'static,
        Fut: Future<Output = T> + Send + 'static,
    {
        let (requests, mut waiting) = mpsc::unbounded_channel::<Waiter<K, T>>();
        tokio::spawn(async move {
            let mut batch: Vec<Waiter<K, T>> = Vec::new();
            while let Some(first) = waiting.recv().await {
                batch.push(first);
                while let Ok(next) = waiting.try_recv() {
                    batch.push(next);
                }
                while let Some(key) = batch.first().map(|(key, _)| key.clone()) {
                    let result = call(key.clone()).await;
                    let mut others = Vec::new();
                    for (k, reply) in batch.drain(..) {
                        if k == key {
                            // A caller that gave up (timed out) no longer listens.
                            let _ = reply.send(result.clone());
                        } else {
                            others.push((k, reply));
                        }
                    }
                    batch = others;
                }
            }
        });
        Coalescer { requests }
    }

    /// The result of a call that started after this one was made; `None` when the owner
    /// task is gone (the runtime is shutting down).
    pub async fn call(&self, key: K) -> Option<T> {
        let (reply, result) = oneshot::channel();
        self.requests.send((key, reply)).ok()?;
        result.await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn callers_waiting_together_share_one_call_and_later_ones_get_a_new_one() {
        let calls = Arc::new(AtomicU64::new(0));
        let gate = Arc::new(tokio::sync::Notify::new());
        let coalescer = {
            let (calls, gate) = (calls.clone(), gate.clone());
            Coalescer::spawn(move |_: ()| {
                let (calls, gate) = (calls.clone(), gate.clone());
                async move {
                    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                    gate.notified().await;
                    n
                }
            })
        };
        // The first caller starts call 1, which blocks; five more arrive meanwhile.
        let first = tokio::spawn({
            let c = coalescer.clone();
            async move { c.call(()).await }
        });
        while calls.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Polled once, each call has queued its request (the send is synchronous) and
        // waits for its reply.
        let mut later: Vec<_> = (0..5).map(|_| Box::pin(coalescer.call(()))).collect();
        for call in &mut later {
            assert!(futures::poll!(call.as_mut()).is_pending());
        }
        gate.notify_one();
        assert_eq!(first.await.unwrap(), Some(1));
        // The five arrived after call 1 started: they all get call 2, none gets call 1.
        while calls.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        gate.notify_one();
        for call in later {
            assert_eq!(call.await, Some(2));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn callers_with_different_keys_get_their_own_calls() {
        let coalescer = Coalescer::spawn(|key: u64| async move { key * 10 });
        let (a, b) = tokio::join!(coalescer.call(1), coalescer.call(2));
        assert_eq!((a, b), (Some(10), Some(20)));
    }
}
