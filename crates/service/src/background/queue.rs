//! The queue of background executions and their turns to run: at most
//! `[background] max_running` at once, and each key's own bound; of the keys with room, the
//! one that started least recently goes next ([`Turns`]), and a key's own in the order they
//! were submitted.

use std::collections::{BTreeMap, HashMap};

use crate::admission::Turns;
use crate::config::BackgroundConfig;
use crate::keys::Key;

/// How many of one key's background executions wait and run.
#[derive(Default, Clone, Copy, Debug)]
pub(super) struct Counts {
    pub(super) queued: usize,
    pub(super) running: usize,
}

/// Those waiting for their turn, and those holding one.
#[derive(Debug, Default)]
pub(super) struct Queue {
    /// Those waiting, in the order they were submitted: their key and how many of its
    /// executions may run at once.
    waiting: BTreeMap<u64, (String, usize)>,
    next_ticket: u64,
    /// Turns held, of all keys.
    running: usize,
    /// Whose turn is next, by key fingerprint.
    turns: Turns,
    /// Each key's, by fingerprint.
    keys: HashMap<String, Counts>,
}

impl Queue {
    /// `fingerprint`'s counts now.
    pub(super) fn of(&self, fingerprint: &str) -> Counts {
        self.keys.get(fingerprint).copied().unwrap_or_default()
    }

    /// A submission of `fingerprint`'s key, whose key may run `per_key` at once, waits from
    /// now: its ticket, its place in the order of submissions.
    pub(super) fn enqueue(&mut self, fingerprint: &str, per_key: usize) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.keys.entry(fingerprint.to_owned()).or_default().queued += 1;
        self.waiting
            .insert(ticket, (fingerprint.to_owned(), per_key));
        ticket
    }

    /// Gives `ticket` its turn if it is its turn: fewer than `max_running` hold one, and of
    /// those whose key has room (one whose key is at its own bound holds up no other key), the
    /// key that started least recently goes first, and its earliest submitted.
    pub(super) fn take_turn(&mut self, ticket: u64, fingerprint: &str, max_running: usize) -> bool {
        let keys = &self.keys;
        let next = self.turns.next(
            self.waiting
                .iter()
                .filter(|(_, (fingerprint, per_key))| {
                    keys.get(fingerprint).map_or(0, |c| c.running) < *per_key
                })
                .map(|(ticket, (fingerprint, _))| (*ticket, fingerprint.as_str())),
        );
        if self.running >= max_running || next != Some(ticket) {
            return false;
        }
        self.waiting.remove(&ticket);
        self.running += 1;
        self.turns.start(fingerprint);
        // Held for its key now, so a second of its executions waits.
        let c = self.keys.entry(fingerprint.to_owned()).or_default();
        c.queued = c.queued.saturating_sub(1);
        c.running += 1;
        true
    }

    /// A turn given back.
    pub(super) fn give_back(&mut self) {
        self.running -= 1;
    }

    /// `ticket` of `fingerprint`'s key leaves: from among those running if it `had_turn`,
    /// else from the queue.
    pub(super) fn leave(&mut self, ticket: u64, fingerprint: &str, had_turn: bool) {
        self.waiting.remove(&ticket);
        let c = self.keys.entry(fingerprint.to_owned()).or_default();
        if had_turn {
            c.running = c.running.saturating_sub(1);
        } else {
            c.queued = c.queued.saturating_sub(1);
        }
    }

    /// Queued and running, of all keys.
    pub(super) fn totals(&self) -> (usize, usize) {
        self.keys
            .values()
            .fold((0, 0), |(q, r), c| (q + c.queued, r + c.running))
    }
}

/// How many of `key`'s background executions may run at once, and wait.
pub(super) fn key_limits(config: &BackgroundConfig, key: &Key) -> (usize, usize) {
    (
        key.config
            .max_background_running
            .unwrap_or(config.max_running_per_key),
        key.config
            .max_background_queued
            .unwrap_or(config.max_queued_per_key),
    )
}
