//! Why a prepare or unprepare of one claim failed: the kubelet gets the whole chain of causes in
//! that claim's `error`, the metrics a short reason.

use super::api::SourceError;
use super::cdi::BuildError;
use super::claim::ClaimError;
use super::storage::checkpoint::CheckpointError;
use super::storage::held_spec::HeldSpecError;
use super::storage::host::HostError;
use crate::discovery::DiscoveryError;

/// An error with its causes, each once (shared with the other roles).
pub(crate) use vgpu_dra_runtime::error_chain as chain;

/// Why one claim failed; the kubelet gets the whole chain of causes in that claim's `error`.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The claim breaks a rule (boxed: it names everything involved).
    #[error(transparent)]
    Claim(Box<ClaimError>),
    /// The claim does not exist (any more).
    #[error("claim {0} not found")]
    NotFound(String),
    /// Reading the claim or its pod failed.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The node-side capacity check refused a share (boxed: it carries every number).
    #[error(transparent)]
    Admit(Box<vgpu_scheduling::AdmitError>),
    /// Discovery has no inventory.
    #[error("discovering GPUs")]
    Discovery(#[source] DiscoveryError),
    /// The claim's spec cannot be expressed.
    #[error("building the CDI spec of claim {claim}")]
    Spec {
        /// The claim.
        claim: String,
        /// Why.
        #[source]
        source: BuildError,
    },
    /// Writing the checkpoint failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Writing or removing a CDI spec failed.
    #[error(transparent)]
    SpecFile(#[from] cdi_spec::SpecDirError),
    /// A host directory of the claim could not be made or removed.
    #[error(transparent)]
    Host(#[from] HostError),
    /// The spec held for a prepared claim did not read back (a bug, not the claim's fault).
    #[error(transparent)]
    HeldSpec(#[from] HeldSpecError),
    /// Making or destroying the MIG instance a device stands for failed.
    #[error("claim {claim}: MIG instance of device {device}")]
    Mig {
        /// The claim.
        claim: String,
        /// The device.
        device: String,
        /// What the card said.
        #[source]
        source: crate::mig::MigError,
    },
    /// The MIG instance exists but the container could not be given its capability nodes.
    #[error("claim {claim}: device {device}: {reason}")]
    MigNodes {
        /// The claim.
        claim: String,
        /// The device.
        device: String,
        /// What is missing.
        reason: String,
    },
}

impl PrepareError {
    /// A short reason for metrics labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Claim(_) => "invalid_claim",
            Self::NotFound(_) => "not_found",
            Self::Source(SourceError::Timeout { .. }) => "api_timeout",
            Self::Source(_) => "api",
            Self::Admit(_) => "over_capacity",
            Self::Discovery(_) => "discovery",
            Self::Spec { .. } => "spec",
            Self::Checkpoint(_) | Self::SpecFile(_) | Self::Host(_) | Self::HeldSpec(_) => "storage",
            Self::Mig { .. } | Self::MigNodes { .. } => "mig",
        }
    }

    /// The message with every cause, for the kubelet and the log: `writing CDI spec /x: Read-only
    /// file system (os error 30)`.
    pub fn chain(&self) -> String {
        chain(self)
    }
}

impl From<ClaimError> for PrepareError {
    fn from(e: ClaimError) -> Self {
        Self::Claim(Box::new(e))
    }
}

impl From<vgpu_scheduling::AdmitError> for PrepareError {
    fn from(e: vgpu_scheduling::AdmitError) -> Self {
        Self::Admit(Box::new(e))
    }
}
