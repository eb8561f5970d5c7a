//! Replayed deliveries: a verified push whose provider and body are byte for byte those of a
//! push accepted in the last [`REPLAY_WINDOW`] asks for nothing new, so it is coalesced rather
//! than nudging another pass (issue 8: a flood of one captured delivery ran passes back to
//! back, 370 in 30 s).
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

use super::Provider;

/// How long an accepted delivery's copies are treated as replays.
pub const REPLAY_WINDOW: Duration = Duration::from_secs(10 * 60);

/// How many accepted deliveries are remembered.
const CAPACITY: usize = 256;

/// The recently accepted pushes.
#[derive(Debug, Default)]
pub struct Replays {
    seen: Mutex<VecDeque<(Provider, [u8; 32], Instant)>>,
}

impl Replays {
    /// Records an accepted delivery and says whether it is new: `false` when an identical one
    /// was recorded within the window before `now` (a replay). One lock covers the check and
    /// the record, so of concurrent copies exactly one is new.
    pub fn claim(&self, provider: Provider, body: &[u8], now: Instant) -> bool {
        let digest = digest(body);
        let mut seen = self.lock();
        let replay = seen.iter().any(|(p, d, at)| {
            *p == provider && *d == digest && now.saturating_duration_since(*at) < REPLAY_WINDOW
        });
        if replay {
            return false;
        }
        seen.retain(|(p, d, _)| !(*p == provider && *d == digest));
        if seen.len() == CAPACITY {
            seen.pop_front();
        }
        seen.push_back((provider, digest, now));
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(Provider, [u8; 32], Instant)>> {
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
    fn an_identical_body_from_the_same_provider_is_a_replay_within_the_window_only() {
        let replays = Replays::default();
        let start = Instant::now();
        assert!(replays.claim(Provider::GitHub, b"push", start));
        assert!(!replays.claim(Provider::GitHub, b"push", start));
        assert!(replays.claim(Provider::Gitea, b"push", start));
        assert!(replays.claim(Provider::GitHub, b"push ", start));
        let later = start + REPLAY_WINDOW;
        assert!(replays.claim(Provider::GitHub, b"push", later));
    }

    #[test]
    fn the_oldest_delivery_is_forgotten_beyond_the_capacity() {
        let replays = Replays::default();
        let now = Instant::now();
        for i in 0..=CAPACITY {
            assert!(replays.claim(Provider::GitHub, i.to_string().as_bytes(), now));
        }
        assert!(replays.claim(Provider::GitHub, b"0", now));
        assert!(!replays.claim(Provider::GitHub, CAPACITY.to_string().as_bytes(), now));
    }

    #[test]
    fn a_delivery_claimed_again_after_the_window_keeps_one_entry() {
        let replays = Replays::default();
        let start = Instant::now();
        replays.claim(Provider::GitHub, b"first", start);
        replays.claim(Provider::GitHub, b"flood", start);
        assert!(replays.claim(Provider::GitHub, b"flood", start + REPLAY_WINDOW));
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
                    (0..100)
                        .filter(|_| replays.claim(Provider::GitHub, b"flood", now))
                        .count()
                })
            })
            .collect();
        let new: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(new, 1);
    }
}
