//! Ended background executions, kept readable until their retention (`[background]
//! retention_ms`) has passed, and the tombstones of those deleted: `deleted` in `meta.json`,
//! their events and result removed, so that the id stays 404 until the retention ends rather
//! than fall back to its audit record.

use std::collections::HashMap;
use std::path::Path;

use super::meta::{write_meta, Meta};

/// The ended executions of this server.
#[derive(Debug, Default)]
pub(super) struct Kept {
    /// Ended ones: owner, when they ended (for their retention), and whether they were
    /// deleted (what is left only says so).
    ended: HashMap<String, (String, u64, bool)>,
    /// Ended ones whose `meta.json` could not be replaced (a full disk): what they are, until
    /// it can be ([`Kept::save_unsaved`] tries again).
    unsaved: HashMap<String, Meta>,
    /// How many ended ones, deleted ones aside, each key keeps, by fingerprint.
    kept: HashMap<String, usize>,
}

impl Kept {
    /// `id`, of the key `owner`, ended at `ended_ms`.
    pub(super) fn add(&mut self, id: &str, owner: &str, ended_ms: u64, deleted: bool) {
        if !deleted {
            *self.kept.entry(owner.to_owned()).or_default() += 1;
        }
        self.ended
            .insert(id.to_owned(), (owner.to_owned(), ended_ms, deleted));
    }

    /// How many ended ones `fingerprint`'s key keeps, deleted ones aside.
    pub(super) fn of(&self, fingerprint: &str) -> usize {
        self.kept.get(fingerprint).copied().unwrap_or(0)
    }

    /// Ended ones kept, deleted ones aside, of all keys.
    pub(super) fn total(&self) -> usize {
        self.kept.values().sum()
    }

    pub(super) fn holds(&self, id: &str) -> bool {
        self.ended.contains_key(id)
    }

    pub(super) fn is_deleted(&self, id: &str) -> bool {
        self.ended.get(id).is_some_and(|(_, _, deleted)| *deleted)
    }

    /// The fingerprint of `id`'s key.
    pub(super) fn owner(&self, id: &str) -> Option<&str> {
        self.ended.get(id).map(|e| e.0.as_str())
    }

    /// What `id` is, when its `meta.json` could not be written.
    pub(super) fn unsaved(&self, id: &str) -> Option<&Meta> {
        self.unsaved.get(id)
    }

    /// `meta` could not be written: kept until it can be.
    pub(super) fn keep_unsaved(&mut self, meta: Meta) {
        self.unsaved.insert(meta.id.clone(), meta);
    }

    pub(super) fn take_unsaved(&mut self, id: &str) -> Option<Meta> {
        self.unsaved.remove(id)
    }

    /// Writes the states that could not be written when they changed, under `root`.
    pub(super) fn save_unsaved(&mut self, root: &Path) {
        self.unsaved
            .retain(|id, meta| write_meta(&root.join(id), meta).is_err());
    }

    /// Marks `id` deleted: whether it was ended and not deleted yet.
    pub(super) fn mark_deleted(&mut self, id: &str) -> bool {
        let Some((owner, _, deleted)) = self.ended.get_mut(id) else {
            return false;
        };
        if *deleted {
            return false;
        }
        *deleted = true;
        if let Some(n) = self.kept.get_mut(owner.as_str()) {
            *n = n.saturating_sub(1);
        }
        true
    }

    /// `id` is gone for good.
    pub(super) fn forget(&mut self, id: &str) {
        self.unsaved.remove(id);
        if let Some((owner, _, deleted)) = self.ended.remove(id) {
            if !deleted {
                if let Some(n) = self.kept.get_mut(&owner) {
                    *n = n.saturating_sub(1);
                }
            }
        }
    }

    /// Those that ended `retention` ms or more before `now_ms`.
    pub(super) fn expired(&self, now_ms: u64, retention: u64) -> Vec<String> {
        self.ended
            .iter()
            .filter(|(_, (_, at, _))| now_ms.saturating_sub(*at) >= retention)
            .map(|(id, _)| id.clone())
            .collect()
    }
}

/// What is left of an ended execution in `dir` once deleted, which ran (its audit record
/// stays): a `meta.json` that only says it is gone. The state, when it could not be written.
pub(super) fn bury(dir: &Path, mut meta: Meta) -> Option<Meta> {
    let _ = std::fs::remove_file(dir.join("events"));
    let _ = std::fs::remove_file(dir.join("result.json"));
    meta.deleted = true;
    meta.has_result = false;
    let Err(e) = write_meta(dir, &meta) else {
        return None;
    };
    tracing::warn!(execution = %meta.id, error = %e, "cannot mark a background execution deleted");
    Some(meta)
}
