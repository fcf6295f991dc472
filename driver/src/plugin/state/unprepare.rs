//! Unprepare, and the claim directories' trash: an unprepare never waits on what a tenant wrote.

use std::sync::Arc;

use vgpu_scheduling::Uid;

use super::{Inner, State, Storage};
use crate::plugin::error::PrepareError;
use crate::plugin::failpoint::{FailPoint, fail_point};
use crate::plugin::storage::trash::{DEFAULT_BUDGET, Trash};
use crate::plugin::storage::{blocking, off_runtime};

impl State {
    /// Unprepares one claim; unknown claims succeed.
    ///
    /// Its file work runs on blocking threads ([`off_runtime`]), with the lock held. It must not
    /// be dropped midway, which would leave the ledger holding the claim's shares: the kubelet's
    /// calls run on a task of their own, and the periodic release stops only with the driver,
    /// which leaves the disk as a crash there would (the record gone first, then the spec, then
    /// the directory), for the next start to finish.
    ///
    /// # Errors
    /// When the checkpoint or spec cannot be written (the kubelet retries).
    pub async fn unprepare(&self, uid: &Uid) -> Result<(), PrepareError> {
        let mut inner = self.settled(uid).await;
        let Inner { ledger, prepared, pending, gone, .. } = &mut *inner;
        let Storage { checkpoint, specs, .. } = &self.storage;
        self.release_instances(uid, prepared)?;
        if let Some(entry) = prepared.remove(uid) {
            let (checkpoint, owned) = (checkpoint.clone(), uid.clone());
            if let Err(e) = off_runtime(move || checkpoint.forget(&owned)).await {
                prepared.insert(uid.clone(), entry);
                return Err(e.into());
            }
            ledger.release_claim(uid);
            self.tell_unprepared(&entry.claim);
            fail_point(self.fail_at, FailPoint::UnprepareCheckpointed);
        }
        if pending.remove(uid).is_some() {
            ledger.release_claim(uid);
        }
        gone.remove(uid);
        self.claims.forget(uid);
        let (specs, owned) = (specs.clone(), uid.clone());
        if off_runtime(move || specs.remove(owned.as_str())).await? {
            fail_point(self.fail_at, FailPoint::UnprepareSpecRemoved);
        }
        // Under the lock: a prepare of the same claim right after makes its directory anew.
        let (trash, dir) = (self.trash(), self.claim_dir_path(uid));
        let (dir, moved) = off_runtime(move || {
            let moved = trash.discard(&dir);
            (dir, moved)
        })
        .await;
        self.discarded(uid, &dir, moved);
        drop(inner);
        self.changed();
        Ok(())
    }

    /// Moves the directory of claim `uid` into the trash (one rename, whatever a container left
    /// in it) and has the trash emptied in the background: an unprepare never waits on what a
    /// tenant wrote. A directory that cannot be moved is logged and left to the periodic sweep.
    /// Called with the lock held, so that it never takes the directory of a prepare after it.
    pub(super) fn discard_dir(&self, uid: &Uid) {
        let dir = self.claim_dir_path(uid);
        let moved = blocking(|| self.trash().discard(&dir));
        self.discarded(uid, &dir, moved);
    }

    /// Where claim `uid`'s directory is.
    fn claim_dir_path(&self, uid: &Uid) -> std::path::PathBuf {
        self.storage.cdi.claims_root.join(uid.as_str())
    }

    /// What follows the move of claim `uid`'s directory `dir` into the trash: the trash
    /// emptied, or why it could not be moved.
    fn discarded(&self, uid: &Uid, dir: &std::path::Path, moved: std::io::Result<bool>) {
        match moved {
            Ok(true) => self.empty_trash(),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(claim = %uid, path = %dir.display(), error = %e, "claim directory not moved to the trash; the periodic check retries");
            }
        }
    }

    /// The trash of the claim directories.
    pub(super) fn trash(&self) -> Trash {
        Trash::new(&self.storage.cdi.claims_root)
    }

    /// Empties the trash on a blocking thread, unless one is at it already; what cannot be
    /// removed now is logged and tried again by the periodic check.
    pub(super) fn empty_trash(&self) {
        use std::sync::atomic::Ordering;
        if self.emptying.swap(true, Ordering::AcqRel) {
            return;
        }
        let (trash, emptying) = (self.trash(), self.emptying.clone());
        let work = move || {
            // Reset even if the walk panics, so the next check tries again.
            struct Done(Arc<std::sync::atomic::AtomicBool>);
            impl Drop for Done {
                fn drop(&mut self) {
                    self.0.store(false, Ordering::Release);
                }
            }
            let _done = Done(emptying);
            let emptied = trash.empty(DEFAULT_BUDGET);
            if emptied.left > 0 {
                tracing::warn!(trash = %trash.dir().display(), left = emptied.left, error = emptied.error.as_deref().unwrap_or("a budget of file operations spent"), "claim directories not all removed yet; retried by the next check");
            } else if emptied.removed > 0 {
                tracing::debug!(removed = emptied.removed, "claim directories removed");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(work)),
            Err(_) => work(),
        }
    }
}
