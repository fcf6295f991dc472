//! Places in prepare and unprepare where a test can make the process die at once.

/// Places in prepare and unprepare where a test can make the process die at once, as `kill -9`
/// would, to prove that every interruption recovers (`--fail-point`, hidden; tests only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailPoint {
    /// Prepare: entry and spec written beside their names, nothing admitted or visible.
    PrepareStaged,
    /// Prepare: shares admitted, nothing persisted.
    PrepareAdmitted,
    /// Prepare: checkpoint written, spec not yet.
    PrepareCheckpointed,
    /// Prepare: spec written, answer not sent.
    PrepareSpecWritten,
    /// Prepare (dynamic MIG): the intent to make an instance recorded, no instance yet.
    PrepareMigIntent,
    /// Prepare (dynamic MIG): the instance made, not yet recorded.
    PrepareMigCreated,
    /// Unprepare (dynamic MIG): the claim's last instance destroyed, its record still there.
    UnprepareMigDestroyed,
    /// Unprepare: checkpoint entry dropped, spec still there.
    UnprepareCheckpointed,
    /// Unprepare: spec removed, claim directory still there.
    UnprepareSpecRemoved,
}

/// Dies here, as `kill -9` would, when `here` is the configured point.
pub(super) fn fail_point(configured: Option<FailPoint>, here: FailPoint) {
    if configured == Some(here) {
        tracing::error!(?here, "fail point reached; killing this process with SIGKILL");
        // The real thing, not an emulation: no destructor, flush or unwinding runs.
        let _ = std::process::Command::new("kill").arg("-KILL").arg(std::process::id().to_string()).status();
        std::process::abort();
    }
}
