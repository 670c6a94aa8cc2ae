//! Budgets of places shared by holders (callers, or peers for health calls), and the bounded,
//! fair admission queue in front of a budget.
//!
//! A call that finds its budget full (or its holder at its share) waits in the queue instead
//! of being refused, while the queue has room. Places given back go straight to a waiter,
//! under the budget's lock: holders with waiters take turns (round-robin), and each holder's
//! waiters are served oldest first, skipping holders already at their share. So one caller's
//! flood, queued first, delays another caller's single call by at most one freed place, and
//! no caller ever runs more than its share. A waiter that gives up (its deadline passed, or
//! the client went away and its future was dropped) leaves the queue, or gives back the
//! place it was handed in the same instant: nothing leaks.
//!
//! A queued call holds its request head (at most `max_header_list_bytes`) and whatever of its
//! body h2 has received into the stream's flow-control window (at most the window,
//! `STREAM_WINDOW_BYTES`, 16 KiB); its
//! body is not read until it is admitted.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;
use tokio::time::Instant;

/// Who a place in a budget is counted against.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Holder {
    /// The principal of a valid token, by its (unique) name.
    Principal(Arc<str>),
    /// The peer's address: no valid token, or authentication off.
    Peer(IpAddr),
    /// No address known (not a TCP connection).
    Unknown,
}

impl Holder {
    /// The holder of a call counted by its peer's address.
    pub(super) fn peer(address: Option<IpAddr>) -> Self {
        address.map_or(Self::Unknown, Self::Peer)
    }
}

/// The settings a budget names when it refuses (ErrorInfo metadata `limit`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Settings {
    /// The budget's total is reached.
    pub total: &'static str,
    /// The holder's share is reached.
    pub per_holder: &'static str,
    /// The queue is full.
    pub queue: &'static str,
}

/// Places shared by holders: at most `total` at once, at most `per_holder` of one holder;
/// but a holder's first `always` places are given even when `total` is reached. Past those,
/// at most `max_queued` calls wait for a place (0: none, refused at once), at most
/// `max_queued_per_holder` of one holder: the queue is shared in the budget's proportion
/// (`max_queued` × `per_holder` / `total`, half with the defaults), so one holder's flood
/// cannot fill it and another holder's call always finds room.
#[derive(Debug)]
pub(super) struct Budget {
    total: usize,
    per_holder: usize,
    always: usize,
    max_queued: usize,
    max_queued_per_holder: usize,
    settings: Settings,
    held: Mutex<BudgetState>,
}

/// One queued call: its number, and where its place is announced.
#[derive(Debug)]
struct Waiter {
    id: u64,
    granted: oneshot::Sender<()>,
}

#[derive(Debug, Default)]
struct BudgetState {
    total: usize,
    by_holder: HashMap<Holder, usize>,
    /// Each holder's waiters, oldest first (no empty queue kept).
    waiting: HashMap<Holder, VecDeque<Waiter>>,
    /// The holders with waiters, in the order of their turns.
    turns: VecDeque<Holder>,
    queued: usize,
    next_id: u64,
}

/// What [`Budget::acquire`] gives: a place now, or a ticket in the queue.
#[derive(Debug)]
pub(super) enum Admit {
    /// A place, at once.
    Now(Place),
    /// A place later, or none (see [`Ticket::granted`]).
    Queued(Ticket),
}

impl Budget {
    /// A budget of `total` places, `per_holder` of one holder (at least 1, at most `total`),
    /// the first `always` of a holder given even past `total`, and `max_queued` waiters.
    pub(super) fn new(
        total: usize,
        per_holder: usize,
        always: usize,
        max_queued: usize,
        settings: Settings,
    ) -> Arc<Self> {
        let total = total.max(1);
        let per_holder = per_holder.clamp(1, total);
        Arc::new(Self {
            total,
            per_holder,
            always: always.min(per_holder),
            max_queued,
            max_queued_per_holder: match max_queued {
                0 => 0,
                _ => (max_queued * per_holder / total).max(1),
            },
            settings,
            held: Mutex::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, BudgetState> {
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A place for `holder` now, a ticket in the queue, or (the queue full or the holder's
    /// share of it, or no queue) the setting that refuses it.
    pub(super) fn acquire(self: &Arc<Self>, holder: Holder) -> Result<Admit, &'static str> {
        let mut held = self.lock();
        let count = held.by_holder.get(&holder).copied().unwrap_or(0);
        let full = held.total >= self.total && count >= self.always;
        let at_share = count >= self.per_holder;
        if !full && !at_share {
            // No waiter can take a free place (see `hand_off`), so none is passed over.
            *held.by_holder.entry(holder.clone()).or_default() += 1;
            held.total += 1;
            return Ok(Admit::Now(Place {
                budget: self.clone(),
                holder,
            }));
        }
        let own_queued = held.waiting.get(&holder).map_or(0, VecDeque::len);
        if held.queued >= self.max_queued || own_queued >= self.max_queued_per_holder {
            return Err(match (self.max_queued, full) {
                (0, true) => self.settings.total,
                (0, false) => self.settings.per_holder,
                _ => self.settings.queue,
            });
        }
        let (granted, receiver) = oneshot::channel();
        let id = held.next_id;
        held.next_id += 1;
        held.queued += 1;
        let waiters = held.waiting.entry(holder.clone()).or_default();
        waiters.push_back(Waiter { id, granted });
        if waiters.len() == 1 {
            held.turns.push_back(holder.clone());
        }
        Ok(Admit::Queued(Ticket {
            budget: self.clone(),
            holder,
            id,
            receiver,
            settled: false,
        }))
    }

    /// Gives `holder`'s place back, and hands free places to waiters.
    fn release(&self, held: &mut BudgetState, holder: &Holder) {
        held.total = held.total.saturating_sub(1);
        if let Some(count) = held.by_holder.get_mut(holder) {
            *count -= 1;
            if *count == 0 {
                held.by_holder.remove(holder);
            }
        }
        while held.total < self.total && self.grant_next(held) {}
    }

    /// Gives one place to the oldest waiter of the next holder (in turn) below its share;
    /// false when there is none.
    fn grant_next(&self, held: &mut BudgetState) -> bool {
        for _ in 0..held.turns.len() {
            let Some(holder) = held.turns.pop_front() else {
                return false;
            };
            let count = held.by_holder.get(&holder).copied().unwrap_or(0);
            if count >= self.per_holder {
                held.turns.push_back(holder);
                continue;
            }
            let Some(waiters) = held.waiting.get_mut(&holder) else {
                continue;
            };
            let waiter = waiters.pop_front();
            if waiters.is_empty() {
                held.waiting.remove(&holder);
            } else {
                held.turns.push_back(holder.clone());
            }
            let Some(waiter) = waiter else { continue };
            held.queued -= 1;
            // The receiver lives as long as the waiter is queued: a ticket leaves the queue
            // under this lock before it is dropped.
            if waiter.granted.send(()).is_ok() {
                *held.by_holder.entry(holder).or_default() += 1;
                held.total += 1;
                return true;
            }
        }
        false
    }

    /// Takes waiter `id` of `holder` out of the queue; false when it is not there (it was
    /// given a place).
    fn leave(held: &mut BudgetState, holder: &Holder, id: u64) -> bool {
        let Some(waiters) = held.waiting.get_mut(holder) else {
            return false;
        };
        let Some(index) = waiters.iter().position(|waiter| waiter.id == id) else {
            return false;
        };
        waiters.remove(index);
        if waiters.is_empty() {
            held.waiting.remove(holder);
            held.turns.retain(|turn| turn != holder);
        }
        held.queued -= 1;
        true
    }
}

/// One place in a [`Budget`], given back (to the next waiter, if any) when dropped.
#[derive(Debug)]
pub(super) struct Place {
    budget: Arc<Budget>,
    holder: Holder,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut held = self.budget.lock();
        self.budget.release(&mut held, &self.holder);
    }
}

/// A call's turn in a [`Budget`]'s queue. Dropped before it is granted, it leaves the queue;
/// dropped in the instant its place was handed over, it gives the place back.
#[derive(Debug)]
pub(super) struct Ticket {
    budget: Arc<Budget>,
    holder: Holder,
    id: u64,
    receiver: oneshot::Receiver<()>,
    settled: bool,
}

impl Ticket {
    /// The place, once one is handed to this call; `None` when `until` comes first (the
    /// call then leaves the queue).
    pub(super) async fn granted(mut self, until: Instant) -> Option<Place> {
        match tokio::time::timeout_at(until, &mut self.receiver).await {
            Ok(Ok(())) => {
                self.settled = true;
                Some(Place {
                    budget: self.budget.clone(),
                    holder: self.holder.clone(),
                })
            }
            // Timed out (or, impossibly, the sender dropped): `Drop` settles the place.
            _ => None,
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut held = self.budget.lock();
        if !Budget::leave(&mut held, &self.holder, self.id) {
            // Granted, but nobody will use it.
            self.budget.release(&mut held, &self.holder);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use std::time::Duration;

    use super::*;

    const SETTINGS: Settings = Settings {
        total: "total",
        per_holder: "per_holder",
        queue: "queue",
    };

    fn now(admit: Result<Admit, &'static str>) -> Place {
        match admit {
            Ok(Admit::Now(place)) => place,
            other => panic!("no place at once: {other:?}"),
        }
    }

    fn queued(admit: Result<Admit, &'static str>) -> Ticket {
        match admit {
            Ok(Admit::Queued(ticket)) => ticket,
            other => panic!("not queued: {other:?}"),
        }
    }

    fn principal(name: &str) -> Holder {
        Holder::Principal(Arc::from(name))
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[test]
    fn one_holder_gets_its_share_and_another_still_fits() {
        let budget = Budget::new(4, 2, 0, 0, SETTINGS);
        let a = principal("a");
        let b = Holder::Peer(IpAddr::from([127, 0, 0, 1]));
        let first = now(budget.acquire(a.clone()));
        let _second = now(budget.acquire(a.clone()));
        assert_eq!(budget.acquire(a.clone()).unwrap_err(), "per_holder");
        let _b1 = now(budget.acquire(b.clone()));
        let _b2 = now(budget.acquire(b.clone()));
        assert_eq!(budget.acquire(b).unwrap_err(), "total");
        drop(first);
        let _again = now(budget.acquire(a));
        // A share above the total is the total.
        assert_eq!(Budget::new(2, 10, 0, 0, SETTINGS).per_holder, 2);
    }

    #[test]
    fn a_holder_s_first_places_are_given_even_when_the_budget_is_full() {
        let budget = Budget::new(2, 2, 1, 0, SETTINGS);
        let a = Holder::Peer(IpAddr::from([127, 0, 0, 2]));
        let b = Holder::Peer(IpAddr::from([127, 0, 0, 3]));
        let _a = (budget.acquire(a.clone()), budget.acquire(a));
        let b1 = now(budget.acquire(b.clone()));
        assert_eq!(budget.acquire(b.clone()).unwrap_err(), "total");
        drop(b1);
        let c = Holder::Peer(IpAddr::from([127, 0, 0, 4]));
        let _c = now(budget.acquire(c));
        assert_eq!(budget.lock().by_holder.len(), 2);
    }

    #[tokio::test]
    async fn a_freed_place_goes_to_the_oldest_waiter_and_the_queue_is_bounded() {
        let budget = Budget::new(1, 1, 0, 2, SETTINGS);
        let held = now(budget.acquire(principal("a")));
        let first = queued(budget.acquire(principal("b")));
        let _second = queued(budget.acquire(principal("b")));
        assert_eq!(budget.acquire(principal("c")).unwrap_err(), "queue");
        drop(held);
        // Handed over under the lock: a newcomer finds the budget still full, and queues.
        let _third = queued(budget.acquire(principal("c")));
        let place = first.granted(soon()).await.unwrap();
        assert_eq!(budget.lock().by_holder[&principal("b")], 1);
        drop(place);
        // B's second waiter had the turn before C's.
        assert_eq!(budget.lock().by_holder[&principal("b")], 1);
        assert_eq!(budget.lock().queued, 1);
    }

    #[test]
    fn one_holder_fills_at_most_its_share_of_the_queue() {
        let budget = Budget::new(2, 1, 0, 4, SETTINGS);
        let _a = now(budget.acquire(principal("a")));
        let _b = now(budget.acquire(principal("b")));
        let _a_waiting: Vec<_> = (0..2)
            .map(|_| queued(budget.acquire(principal("a"))))
            .collect();
        assert_eq!(budget.acquire(principal("a")).unwrap_err(), "queue");
        let _b_waiting: Vec<_> = (0..2)
            .map(|_| queued(budget.acquire(principal("b"))))
            .collect();
        assert_eq!(budget.acquire(principal("c")).unwrap_err(), "queue");
        assert_eq!(
            Budget::new(128, 64, 0, 4096, SETTINGS).max_queued_per_holder,
            2048
        );
        assert_eq!(Budget::new(8, 1, 0, 2, SETTINGS).max_queued_per_holder, 1);
    }

    #[tokio::test]
    async fn holders_take_turns_and_none_runs_past_its_share() {
        let budget = Budget::new(2, 1, 0, 8, SETTINGS);
        let (a, b) = (principal("a"), principal("b"));
        let a_running = now(budget.acquire(a.clone()));
        let c_running = now(budget.acquire(principal("c")));
        // A floods first; B asks once after.
        let a_waiting: Vec<_> = (0..4).map(|_| queued(budget.acquire(a.clone()))).collect();
        let b_waiting = queued(budget.acquire(b.clone()));
        // C's place frees: A is at its share, so B gets it though A queued first.
        drop(c_running);
        let b_place = b_waiting.granted(soon()).await.unwrap();
        assert_eq!(budget.lock().by_holder[&a], 1);
        // A's own place frees: its oldest waiter gets it.
        drop(a_running);
        let mut a_waiting = a_waiting.into_iter();
        let a_place = a_waiting.next().unwrap().granted(soon()).await.unwrap();
        assert_eq!(budget.lock().queued, 3);
        drop((a_place, b_place));
        assert_eq!(budget.lock().by_holder[&a], 1);
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_leaves_the_queue_or_gives_its_place_back() {
        let budget = Budget::new(1, 1, 0, 4, SETTINGS);
        let held = now(budget.acquire(principal("a")));
        let late = queued(budget.acquire(principal("b")));
        let until = Instant::now() + Duration::from_millis(100);
        assert!(late.granted(until).await.is_none());
        assert_eq!(budget.lock().queued, 0);
        assert!(budget.lock().turns.is_empty());
        // Dropped (the client went away) after its place was handed over: given back.
        let abandoned = queued(budget.acquire(principal("b")));
        drop(held);
        assert_eq!(budget.lock().total, 1);
        drop(abandoned);
        let state = budget.lock();
        assert_eq!((state.total, state.queued), (0, 0));
        assert!(state.by_holder.is_empty() && state.waiting.is_empty());
    }
}
