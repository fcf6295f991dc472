//! A new claim's files, made while its claim is read: the checkpoint record's and the spec's temp
//! files (from spares made ahead when there are some), written beside their names; the record
//! is fsynced here when other prepares are in flight, else after its rename ([`RecordSync`]).

use cdi_spec::{Spec, SpecDir, StagedSpec};
use vgpu_dra_runtime::sync::lock;

use super::State;
use crate::plugin::error::{PrepareError, chain};
use crate::plugin::storage::checkpoint::{Checkpoint, CheckpointError, PreparedClaim, RecordSync, WrittenRecord};
use crate::plugin::storage::{blocking, joined, off_runtime};

/// A claim's checkpoint record and spec, written beside their names, not yet visible.
pub(super) struct StagedClaim {
    pub(super) record: WrittenRecord,
    pub(super) spec: StagedSpec,
}

/// A new claim's first file work, on the blocking thread that looks up the toolkit's device
/// names: the temp files of the claim's record and spec are made while the claim is read.
pub(super) struct Stager {
    work: tokio::task::JoinHandle<(Vec<String>, ReservedFiles)>,
    storage: (Checkpoint, SpecDir),
}

/// The temp files of a claim's record and spec.
type ReservedFiles = (Result<crate::fsutil::Reserved, CheckpointError>, Result<cdi_spec::ReservedSpec, cdi_spec::SpecDirError>);

impl Stager {
    /// Writes `entry`'s checkpoint record (fsynced as `sync` says) and `spec`, its spec parsed,
    /// into the files made for them, off the runtime; with the toolkit's device names.
    pub(super) async fn stage(
        self,
        entry: &PreparedClaim,
        spec: Spec,
        sync: RecordSync,
    ) -> (Vec<String>, Result<StagedClaim, PrepareError>) {
        let (toolkit, (record, spec_file)) = joined(self.work.await);
        let (checkpoint, specs) = self.storage;
        let entry = entry.clone();
        let staged = off_runtime(move || {
            // A failed reservation drops the other one here, off the runtime.
            let (record, file) = (record?, spec_file?);
            let record = checkpoint.write_in(record, &entry, &spec, sync)?;
            let spec = specs.stage_in(file, entry.claim.uid.as_str(), &spec)?;
            Ok(StagedClaim { record, spec })
        });
        (toolkit, staged.await)
    }

    /// Waits for the files and removes them unused; the toolkit's device names, looked up
    /// meanwhile.
    pub(super) async fn discard(self) -> Vec<String> {
        let (toolkit, files) = joined(self.work.await);
        blocking(|| drop(files));
        toolkit
    }
}

impl State {
    /// Starts a new claim's [`Stager`], with spare files when there are some.
    pub(super) fn stager(&self) -> Stager {
        let storage = (self.storage.checkpoint.clone(), self.storage.specs.clone());
        let (checkpoint, specs) = storage.clone();
        let toolkit = self.toolkit_lookup();
        let spare = lock(&self.spares).files.pop();
        let work = tokio::task::spawn_blocking(move || {
            let toolkit = toolkit.map(|lookup| lookup()).unwrap_or_default();
            let files = match spare {
                Some((record, spec)) if record.still_there() && spec.still_there() => (Ok(record), Ok(spec)),
                // None, or a spare whose directory was emptied (dropped: what is left is removed).
                _ => (checkpoint.reserve(), specs.reserve()),
            };
            (toolkit, files)
        });
        self.make_spares();
        Stager { work, storage }
    }

    /// Makes temp files for the next prepares on blocking threads, up to
    /// [`StateOptions::spare_files`]; no prepare waits for them.
    pub(super) fn make_spares(&self) {
        let mut spares = lock(&self.spares);
        let missing = self.options.spare_files.saturating_sub(spares.files.len() + spares.making);
        spares.making += missing;
        drop(spares);
        for _ in 0..missing {
            let (checkpoint, specs, pool) = (self.storage.checkpoint.clone(), self.storage.specs.clone(), self.spares.clone());
            tokio::task::spawn_blocking(move || {
                let made = (checkpoint.reserve(), specs.reserve());
                let mut spares = lock(&pool);
                spares.making -= 1;
                match made {
                    (Ok(record), Ok(spec)) => spares.files.push((record, spec)),
                    (record, spec) => {
                        drop(spares);
                        if let Err(e) = &record {
                            tracing::debug!(error = %chain(e), "no spare record file; prepares make their own");
                        }
                        if let Err(e) = &spec {
                            tracing::debug!(error = %chain(e), "no spare spec file; prepares make their own");
                        }
                    }
                }
            });
        }
    }
}
