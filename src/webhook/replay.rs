//! Replayed deliveries: a verified push whose body is byte for byte that of a push accepted in
//! the last [`REPLAY_WINDOW`], on any of the four endpoints, asks for nothing new, so it is
//! coalesced rather than nudging another pass (issue 8: a flood of one captured delivery ran
//! passes back to back, 370 in 30 s). The key is the body alone (SECURITY-AUDIT.md L3): one
//! captured Gitea delivery carries Gitea's, Gogs' and GitHub's signature headers, and keyed on
//! (provider, body) it started a pass on each of the four endpoints.
//!
//! Why identical means redundant: the first copy was accepted before the pass it nudged (or
//! coalesced into) started, and that pass fetches whatever the branch holds then, so every
//! later copy describes a push that pass already sees. Forges never send the same body for two
//! pushes (`before`/`after` and timestamps differ). HMAC carries no nonce and the delivery-id
//! headers are not signed, so the body is the only thing a replay cannot change.
//!
//! Bounded: the last `CAPACITY` accepted deliveries, as SHA-256 digests.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// How long an accepted delivery's copies are treated as replays.
pub const REPLAY_WINDOW: Duration = Duration::from_secs(10 * 60);

/// How many accepted deliveries are remembered.
const CAPACITY: usize = 256;

/// The recently accepted pushes.
#[derive(Debug, Default)]
pub struct Replays {
    seen: Mutex<VecDeque<([u8; 32], Instant)>>,
}

impl Replays {
    /// Records an accepted delivery and says whether it is new: `false` when an identical one
    /// was recorded within the window before `now` (a replay). One lock covers the check and
    /// the record, so of concurrent copies exactly one is new.
    pub fn claim(&self, body: &[u8], now: Instant) -> bool {
        let digest = digest(body);
        let mut seen = self.lock();
        let replay = seen
            .iter()
            .any(|(d, at)| *d == digest && now.saturating_duration_since(*at) < REPLAY_WINDOW);
        if replay {
            return false;
        }
        seen.retain(|(d, _)| *d != digest);
        if seen.len() == CAPACITY {
            seen.pop_front();
        }
        seen.push_back((digest, now));
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<([u8; 32], Instant)>> {
        // Nothing can panic while the lock is held; a poisoned list is still a valid list.
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn digest(body: &[u8]) -> [u8; 32] {
    Sha256::digest(body).into()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn an_identical_body_is_a_replay_within_the_window_only() {
        let replays = Replays::default();
        let start = Instant::now();
        assert!(replays.claim(b"push", start));
        assert!(!replays.claim(b"push", start));
        assert!(replays.claim(b"push ", start));
        let later = start + REPLAY_WINDOW;
        assert!(replays.claim(b"push", later));
    }

    #[test]
    fn the_oldest_delivery_is_forgotten_beyond_the_capacity() {
        let replays = Replays::default();
        let now = Instant::now();
        for i in 0..=CAPACITY {
            assert!(replays.claim(i.to_string().as_bytes(), now));
        }
        assert!(replays.claim(b"0", now));
        assert!(!replays.claim(CAPACITY.to_string().as_bytes(), now));
    }

    #[test]
    fn a_delivery_claimed_again_after_the_window_keeps_one_entry() {
        let replays = Replays::default();
        let start = Instant::now();
        replays.claim(b"first", start);
        replays.claim(b"flood", start);
        assert!(replays.claim(b"flood", start + REPLAY_WINDOW));
        assert_eq!(replays.lock().len(), 2);
    }

    #[test]
    fn of_concurrent_copies_of_one_delivery_exactly_one_is_new() {
        let replays = Arc::new(Replays::default());
        let now = Instant::now();
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let replays = Arc::clone(&replays);
                std::thread::spawn(move || {
                    (0..100).filter(|_| replays.claim(b"flood", now)).count()
                })
            })
            .collect();
        let new: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(new, 1);
    }
}
