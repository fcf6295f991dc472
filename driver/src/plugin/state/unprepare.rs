//! Unprepare, and the claim directories' trash: an unprepare never waits on what a tenant wrote.

use std::sync::Arc;

use vgpu_scheduling::Uid;

use super::{Inner, State};
use crate::plugin::error::PrepareError;
use crate::plugin::failpoint::{FailPoint, fail_point};
use crate::plugin::storage::trash::{DEFAULT_BUDGET, Trash};
use crate::plugin::storage::{blocking, off_runtime};

impl State {
    /// Unprepares one claim; unknown claims succeed.
    ///
    /// A prepared claim is marked committing under the lock, so that a prepare or an unprepare
    /// of it waits and no sweep or repair touches its files; then, without the lock, its record
    /// is removed and made durably gone by a fsync of the checkpoint directory shared with the
    /// prepares and unprepares in flight (group commit), its spec removed and its directory
    /// moved to the trash; under the lock again it leaves the ledger. Its shares are held until
    /// its record is durably gone. A claim holding MIG instances is unprepared wholly under the
    /// lock, so that the card and the records move together.
    ///
    /// Its file work runs on blocking threads ([`off_runtime`]). It must not be dropped midway,
    /// which would leave the claim marked committing: the kubelet's calls run on a task of their
    /// own, and the periodic release stops only with the driver, which leaves the disk as a crash
    /// there would (the record gone first, then the spec, then the directory), for the next start
    /// to finish.
    ///
    /// # Errors
    /// When the checkpoint or spec cannot be written (the kubelet retries).
    pub async fn unprepare(&self, uid: &Uid) -> Result<(), PrepareError> {
        let mut inner = self.settled(uid).await;
        if !inner.prepared.get(uid).is_some_and(|entry| entry.mig.is_empty()) {
            return self.unprepare_locked(uid, inner).await;
        }
        inner.committing.insert(uid.clone());
        drop(inner);
        if let Err(e) = self.forget_record(uid).await {
            // Still prepared: the kubelet retries.
            self.settle(uid, &mut *self.inner.lock().await);
            return Err(e);
        }
        fail_point(self.fail_at, FailPoint::UnprepareCheckpointed);
        let removed = self.remove_files(uid).await;
        let mut inner = self.inner.lock().await;
        self.leave(uid, &mut inner);
        self.settle(uid, &mut inner);
        drop(inner);
        self.changed();
        removed
    }

    /// [`State::unprepare`] with the lock held throughout: claims holding MIG instances, and
    /// claims not prepared (whose spec and directory may still be there after a failed try).
    async fn unprepare_locked(&self, uid: &Uid, mut inner: tokio::sync::MutexGuard<'_, Inner>) -> Result<(), PrepareError> {
        self.release_instances(uid, &inner.prepared)?;
        if inner.prepared.contains_key(uid) {
            // On failure it stays prepared: the kubelet retries.
            self.forget_record(uid).await?;
            fail_point(self.fail_at, FailPoint::UnprepareCheckpointed);
        }
        self.leave(uid, &mut inner);
        // Under the lock: a prepare of the same claim right after makes its directory anew.
        let removed = self.remove_files(uid).await;
        drop(inner);
        self.changed();
        removed
    }

    /// Takes claim `uid` out of the state once its record is durably gone: its shares (or its
    /// pending placeholder) released, its status told, what was read of it dropped.
    fn leave(&self, uid: &Uid, inner: &mut Inner) {
        let Inner { ledger, prepared, pending, gone, .. } = inner;
        if let Some(entry) = prepared.remove(uid) {
            ledger.release_claim(uid);
            self.tell_unprepared(&entry.claim);
        }
        if pending.remove(uid).is_some() {
            ledger.release_claim(uid);
        }
        gone.remove(uid);
        self.claims.forget(uid);
    }

    /// Removes claim `uid`'s record and waits for a fsync of the checkpoint directory that
    /// started after the removal (shared, see [`State::sync_records`]).
    async fn forget_record(&self, uid: &Uid) -> Result<(), PrepareError> {
        let (checkpoint, owned) = (self.storage.checkpoint.clone(), uid.clone());
        off_runtime(move || checkpoint.remove(&owned)).await?;
        // Also when it was gone already: a try before may have removed it and failed to sync.
        self.sync_records().await
    }

    /// Removes claim `uid`'s spec, then moves its directory to the trash (a spec that cannot be
    /// removed leaves the directory to the periodic sweep). With the lock held or the claim
    /// marked committing: a prepare of the same claim after it makes its directory anew.
    async fn remove_files(&self, uid: &Uid) -> Result<(), PrepareError> {
        let (specs, owned) = (self.storage.specs.clone(), uid.clone());
        if off_runtime(move || specs.remove(owned.as_str())).await? {
            fail_point(self.fail_at, FailPoint::UnprepareSpecRemoved);
        }
        let (trash, dir) = (self.trash(), self.claim_dir_path(uid));
        let (dir, moved) = off_runtime(move || {
            let moved = trash.discard(&dir);
            (dir, moved)
        })
        .await;
        self.discarded(uid, &dir, moved);
        Ok(())
    }

    /// Ends claim `uid`'s commit ([`Inner::committing`]) and wakes whoever waits for it.
    pub(super) fn settle(&self, uid: &Uid, inner: &mut Inner) {
        inner.committing.remove(uid);
        self.committed.notify_waiters();
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
