//! The kubelet plugin: registration with the kubelet, the DRA services, claim preparation with
//! CDI specs and a checkpoint.
//!
//! Each folder is one kind of dependency, and imports only what lies below it:
//! - `kubelet/`: the kubelet's wire (sockets, HTTP/2 shim, registration, DRA and health services);
//! - `state/`: prepare, unprepare, start-up and periodic checks, under one lock;
//! - `api/`: the API server (claims and this node's pods read ahead; events and the claims'
//!   `status.devices` written in the background);
//! - `storage/`: blocking disk work (checkpoint, host files, the toolkit's specs, trash);
//! - pure rules with no I/O: `claim` (is it ours, which shares), `containers` (how the pod's
//!   containers use it), `cdi` (the spec), `device_status` (what the claim's status says of it);
//!   and `error`, `failpoint`, `report`; `mig` (which devices stand for a MIG instance to make,
//!   and what a record keeps of it).
//!
//! A prepare, file by file:
//! 1. `kubelet/uds.rs` accepts the kubelet's connection; `kubelet/service.rs` takes the batch and
//!    calls [`state::State::prepare`] for each claim, timing it.
//! 2. `state/prepare.rs`: a claim already prepared is answered from its record (its spec
//!    rewritten if it went missing). Otherwise `state/staging.rs` starts making the record's and
//!    spec's temp files on a blocking thread, while the claim is read through `api/source.rs`:
//!    taken from what `api/node_pods.rs` read ahead when its pod was bound here, else a quorum
//!    GET (`api/read.rs`).
//! 3. `claim.rs` checks that the claim is allocated here and works out each share's limits;
//!    `cdi.rs` builds the spec from them.
//! 4. `containers.rs` checks how the pod's containers use the claim (the pod read through
//!    `api/source.rs`) while `state/staging.rs` writes the record (`storage/checkpoint.rs`,
//!    fsynced now when other prepares are in flight) and the spec beside their names.
//! 5. `state/prepare.rs` commits: under the lock the ledger admits the shares; outside it the
//!    record is renamed into place (fsynced after the rename if not before) and made durable
//!    by a directory fsync shared with the prepares in flight, the claim's host directory made (`storage/host.rs`) and the spec
//!    renamed into place; a `failpoint` sits between each step. The answer names the CDI
//!    devices, with the NVIDIA toolkit's own (`storage/toolkit.rs`).
//!
//! A claim on a dynamic-MIG device (`mig.rs` says which) takes another road after step 4:
//! `state/mig_steps.rs` admits it, records the intent, makes the instance, and writes the record
//! and the spec on the instance (its UUID, its two capability nodes).
//!
//! An unprepare (`state/unprepare.rs`) drops the record, then the spec, and renames the claim's
//! directory into the trash (`storage/trash.rs`), emptied in the background. `state/recovery.rs`
//! rebuilds the ledger at start-up and runs the periodic checks.

pub mod api;
pub mod cdi;
pub mod claim;
pub mod containers;
pub mod device_status;
pub mod error;
pub mod failpoint;
pub mod kubelet;
pub mod mig;
pub mod report;
pub mod state;
pub mod storage;
