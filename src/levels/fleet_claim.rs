//! One build per key across the fleet's store: a node that publishes what it builds claims
//! the key in the store (`SET NX` with an expiry, `EXPIRY`) before it builds, renews the
//! claim every `claims::RENEW` while it builds, and lets go once it has published. Any
//! node that misses a key claimed there waits for its entry (or its failure) to appear in
//! the store. A holder killed or stopped renews no more: its claim expires within
//! `EXPIRY`, and a waiter takes it. A store that fails is left alone (said once), and the
//! request builds alone: nothing here fails a compile.

use super::claims::STALLED;
use super::{failure_key, Levels, Refusal, Target};
use crate::cache::{Cache, Ledger};
use crate::store::remote::{self, Claimed, Config};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long a claim in the store lives unless renewed: a holder gone (killed, stopped,
/// cut off) is known to every waiter within it, whatever the hosts' clocks say.
pub const EXPIRY: Duration = STALLED;
const PAUSE: Duration = Duration::from_millis(200);

impl Levels {
    /// The store's part of a request's turn: its claim there (Some(None): no claim, build
    /// alone), or None when the store now holds the key's entry (ask the levels again),
    /// or the failure it holds.
    pub(super) fn fleet_turn(
        &self,
        (key, target): (&str, Target<'_>),
        (bound, cancel): (Option<Duration>, &AtomicBool),
        notes: &mut Vec<String>,
    ) -> std::result::Result<Option<Option<FleetClaim>>, Refusal> {
        let Some(cfg) = &self.fleet else {
            return Ok(Some(None));
        };
        let ledger = self.cache.as_ref().and_then(Cache::ledger_to_count);
        let failed = failure_key(key);
        match turn(cfg, (key, &failed), (bound, cancel), ledger.as_deref()) {
            FleetTurn::Mine(claim) => Ok(Some(Some(claim))),
            FleetTurn::Alone(why) => {
                notes.extend(why);
                Ok(Some(None))
            }
            FleetTurn::Cancelled => Err(Refusal::cancelled()),
            FleetTurn::Answered(waited, failed) => {
                let refusal = failed
                    .then(|| self.remembered((key, target), true, notes))
                    .flatten();
                self.waited_for(refusal, waited, notes).map(|_| None)
            }
        }
    }
}

/// A key's claim in the store, held: renewed until dropped, then let go.
pub struct FleetClaim {
    cfg: Config,
    key: String,
    token: String,
    renewing: Option<std::sync::mpsc::Sender<()>>,
}

impl Drop for FleetClaim {
    fn drop(&mut self) {
        drop(self.renewing.take());
        remote::release_claim(&self.cfg, &self.key, &self.token);
    }
}

/// How a request's turn at the store ended.
pub enum FleetTurn {
    /// This node holds the key's claim: it builds and publishes.
    Mine(FleetClaim),
    /// The store holds the key's entry, or (`true`) its failure, now (after waiting this
    /// long).
    Answered(Duration, bool),
    /// No claim here (a read-only node with no one building it, a store that failed, a
    /// wait past its bound): build alone, for the reason given (None: nothing to say).
    Alone(Option<String>),
    Cancelled,
}

/// This request's turn at `key` in the store: take its claim, or wait for the node that
/// holds it until the store holds the key's entry or its failure (at `failed`), its claim
/// is let go or expires (then take it), `bound` passes or `cancel` is set.
pub fn turn(
    cfg: &Config,
    (key, failed): (&str, &str),
    (bound, cancel): (Option<Duration>, &AtomicBool),
    ledger: Option<&Ledger>,
) -> FleetTurn {
    // What the store holds now: the entry (false), else the failure (true).
    let found = || match remote::holds(cfg, key) {
        true => Some(false),
        false => remote::holds(cfg, failed).then_some(true),
    };
    let token = crate::cache::lease::random_token("a claim");
    let start = Instant::now();
    // The caller has just missed the entry: before a wait only the failure is looked for
    // (an entry there it refused, an untrusted one, is no answer; a build published in
    // the moment between its look and the claim costs a second build, never a wrong one).
    let mut waited = false;
    loop {
        if cancel.load(Ordering::Relaxed) {
            return FleetTurn::Cancelled;
        }
        let claimed = remote::take_claim(cfg, (key, &token), EXPIRY, ledger);
        let now = match claimed {
            Claimed::Held => found(),
            _ if waited => found(),
            _ => remote::holds(cfg, failed).then_some(true),
        };
        if let Some(failed) = now {
            if claimed == Claimed::Taken {
                remote::release_claim(cfg, key, &token);
            }
            return FleetTurn::Answered(start.elapsed(), failed);
        }
        match claimed {
            Claimed::Taken => return FleetTurn::Mine(FleetClaim::renewed(cfg, key, token)),
            Claimed::No => return FleetTurn::Alone(None),
            Claimed::Foreign => {
                return FleetTurn::Alone(Some(
                    "the store's claim on this kernel is not one of ours (it does not expire \
                     as ours do): built here"
                        .into(),
                ))
            }
            Claimed::Held => {}
        }
        if bound.is_some_and(|b| start.elapsed() >= b) {
            let waited = start.elapsed().as_secs_f64();
            return FleetTurn::Alone(Some(format!(
                "waited {waited:.1} s for another node's build, as long as this request's \
                 own may take: built here"
            )));
        }
        std::thread::sleep(PAUSE);
        waited = true;
    }
}

impl FleetClaim {
    /// The claim taken, renewed every `RENEW` until dropped; a renewal that failed (the
    /// store for a moment) is tried again a second later.
    fn renewed(cfg: &Config, key: &str, token: String) -> FleetClaim {
        let (cfg2, key2, token2) = (cfg.clone(), key.to_string(), token.clone());
        let renew = move || {
            let _ = remote::renew_claim(&cfg2, &key2, &token2, EXPIRY);
            true
        };
        FleetClaim {
            cfg: cfg.clone(),
            key: key.to_string(),
            token,
            renewing: super::claims::renewing("xpu-zebin-fleet-claim", renew),
        }
    }
}
