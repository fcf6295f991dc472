//! Prepare and unprepare under one lock: the ledger, the checkpoint and the CDI spec files move
//! together. Order of writes makes a crash at any point safe:
//! prepare writes the checkpoint entry before the spec (a spec never exists without its entry),
//! unprepare drops the entry before the spec (a left-over spec is an orphan, removed at start).

use std::collections::BTreeMap;
use std::sync::Arc;

use cdi_spec::{QualifiedDeviceId, SpecDir};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use tokio::sync::Mutex;
use vgpu_scheduling::{DeviceName, Ledger, PublishedDevice, SharingConfig, Uid, publish};

use super::cdi::{ANNOTATION_CLAIM, CdiOptions, build_spec, claim_dir};
use super::checkpoint::{Checkpoint, PreparedClaim};
use super::claim::{ClaimError, ClaimRef, devices_of};
use crate::discovery::DeviceSource;

/// One device of a prepare answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDevice {
    /// The claim's request.
    pub request: String,
    /// The pool (node name).
    pub pool: String,
    /// The device.
    pub device: String,
    /// CDI IDs for the runtime.
    pub cdi_ids: Vec<String>,
    /// Share ID.
    pub share_id: Option<String>,
    /// What the share consumes, for the log line: `memory=4Gi,cores=50,shares=1`.
    pub consumed: String,
}

/// Why one claim failed; the text goes to the kubelet in that claim's `error`.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The claim breaks a rule.
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// The claim does not exist (any more).
    #[error("claim {0} not found")]
    NotFound(String),
    /// Reading the claim failed.
    #[error("reading claim {claim}: {reason}")]
    Api {
        /// The claim.
        claim: String,
        /// The API error.
        reason: String,
    },
    /// The node-side capacity check refused a share (boxed: it carries every number).
    #[error(transparent)]
    Admit(Box<vgpu_scheduling::AdmitError>),
    /// Discovery failed.
    #[error("discovering GPUs: {0}")]
    Discovery(String),
    /// Writing state failed.
    #[error("{0}")]
    Storage(String),
}

impl PrepareError {
    /// A short reason for metrics labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Claim(_) => "invalid_claim",
            Self::NotFound(_) => "not_found",
            Self::Api { .. } => "api",
            Self::Admit(_) => "over_capacity",
            Self::Discovery(_) => "discovery",
            Self::Storage(_) => "storage",
        }
    }
}

impl From<vgpu_scheduling::AdmitError> for PrepareError {
    fn from(e: vgpu_scheduling::AdmitError) -> Self {
        Self::Admit(Box::new(e))
    }
}

/// Places in prepare and unprepare where a test can make the process die at once, as `kill -9`
/// would, to prove that every interruption recovers (`--fail-point`, hidden; tests only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailPoint {
    /// Prepare: shares admitted, nothing persisted.
    PrepareAdmitted,
    /// Prepare: checkpoint written, spec not yet.
    PrepareCheckpointed,
    /// Prepare: spec written, answer not sent.
    PrepareSpecWritten,
    /// Unprepare: checkpoint entry dropped, spec still there.
    UnprepareCheckpointed,
    /// Unprepare: spec removed, claim directory still there.
    UnprepareSpecRemoved,
}

fn fail_point(configured: Option<FailPoint>, here: FailPoint) {
    if configured == Some(here) {
        tracing::error!(?here, "fail point reached; killing this process with SIGKILL");
        // The real thing, not an emulation: no destructor, flush or unwinding runs.
        let _ = std::process::Command::new("kill").arg("-KILL").arg(std::process::id().to_string()).status();
        std::process::abort();
    }
}

/// One prepared share, as the metrics see it.
#[derive(Debug, Clone)]
pub struct ShareUsage {
    /// The claim.
    pub claim: ClaimRef,
    /// The pod (in the claim's namespace) the claim is reserved for, when known.
    pub pod: Option<String>,
    /// The device the share is on.
    pub device: DeviceName,
    /// What the share consumes.
    pub consumption: vgpu_scheduling::Consumption,
}

/// The plugin's state.
pub struct State {
    inner: Mutex<Inner>,
    claims: Option<kube::Client>,
    cache: Option<kube::runtime::reflector::Store<ResourceClaim>>,
    metrics: Option<Arc<crate::metrics::Metrics>>,
    source: Arc<dyn DeviceSource>,
    config: SharingConfig,
    node: String,
    fail_at: Option<FailPoint>,
}

struct Inner {
    ledger: Ledger,
    prepared: BTreeMap<Uid, PreparedClaim>,
    checkpoint: Checkpoint,
    specs: SpecDir,
    cdi: CdiOptions,
}

impl State {
    /// Loads the checkpoint (moving a corrupt one aside and rebuilding from the spec files and
    /// the API), restores missing specs, removes orphaned ones and rebuilds the ledger.
    ///
    /// # Errors
    /// When discovery fails or the spec directory cannot be read.
    pub async fn recover(
        client: Option<kube::Client>,
        source: Arc<dyn DeviceSource>,
        config: SharingConfig,
        node: String,
        checkpoint: Checkpoint,
        cdi: CdiOptions,
        spec_dir: SpecDir,
    ) -> anyhow::Result<Self> {
        let loaded = checkpoint.load()?;
        for (e, aside) in &loaded.corrupt {
            tracing::error!(error = %e, moved_to = %aside.display(), "checkpoint corrupt; rebuilding from CDI specs and the API");
        }
        let rebuilt = !loaded.corrupt.is_empty();
        let prepared = loaded.claims;
        let state = Self {
            inner: Mutex::new(Inner { ledger: Ledger::default(), prepared, checkpoint, specs: spec_dir, cdi }),
            claims: client,
            cache: None,
            metrics: None,
            source,
            config,
            node,
            fail_at: None,
        };
        state.startup_sync(rebuilt).await?;
        Ok(state)
    }

    /// Serves claim reads from a watch cache, falling back to GET on a miss or a stale entry.
    #[must_use]
    pub fn with_claim_cache(mut self, cache: kube::runtime::reflector::Store<ResourceClaim>) -> Self {
        self.cache = Some(cache);
        self
    }

    /// Records prepare and unprepare figures in `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The metrics, when configured.
    pub fn metrics(&self) -> Option<&crate::metrics::Metrics> {
        self.metrics.as_deref()
    }

    /// Makes the process abort at `point` (tests of crash recovery).
    #[must_use]
    pub fn with_fail_point(mut self, point: Option<FailPoint>) -> Self {
        self.fail_at = point;
        self
    }

    /// The devices this node publishes now, from a fresh inventory read.
    ///
    /// # Errors
    /// When discovery fails.
    pub fn published(&self) -> Result<Vec<PublishedDevice>, PrepareError> {
        let inventory = self.source.inventory().map_err(|e| PrepareError::Discovery(e.to_string()))?;
        Ok(publish(&inventory, &self.config))
    }

    async fn startup_sync(&self, rebuild: bool) -> anyhow::Result<()> {
        let published = self.published()?;
        let owned = {
            let inner = self.inner.lock().await;
            inner.specs.remove_stale_temps()?;
            inner.specs.list_owned()?
        };
        // Specs without an entry: adopt them when the checkpoint was lost and the claim still
        // stands, else they are orphans of an interrupted unprepare.
        for spec in &owned {
            let Ok(uid) = Uid::new(spec.id.clone()) else { continue };
            if self.inner.lock().await.prepared.contains_key(&uid) {
                continue;
            }
            let adopted = if rebuild { self.adopt(&uid, &published).await } else { None };
            let mut inner = self.inner.lock().await;
            match adopted {
                Some(entry) => {
                    tracing::info!(claim = %entry.claim, "re-adopted prepared claim from its CDI spec");
                    inner.checkpoint.record(&entry)?;
                    inner.prepared.insert(uid, entry);
                }
                None => {
                    tracing::info!(claim = %uid, "removing CDI spec of a claim that is not prepared");
                    inner.specs.remove(uid.as_str())?;
                    let dir = inner.cdi.claims_root.join(uid.as_str());
                    let _ = tokio::fs::remove_dir_all(dir).await;
                }
            }
        }
        let mut inner = self.inner.lock().await;
        let Inner { ledger, prepared, specs, cdi, .. } = &mut *inner;
        ledger.set_capacity(capacities(&published));
        for (uid, entry) in prepared.iter() {
            for d in &entry.devices {
                if let Err(e) = ledger.admit(d.key(uid), d.consumption.clone()) {
                    tracing::error!(claim = %entry.claim, error = %e, "prepared claim no longer fits its device");
                }
            }
            if specs.read(uid.as_str())?.is_none() {
                tracing::info!(claim = %entry.claim, "rewriting missing CDI spec");
                ensure_dir(&claim_dir(cdi, &entry.claim)).await?;
                specs.write(uid.as_str(), &entry.spec)?;
            }
        }
        Ok(())
    }

    /// Rebuilds a checkpoint entry from a spec's claim annotation and the claim in the API.
    async fn adopt(&self, uid: &Uid, published: &[PublishedDevice]) -> Option<PreparedClaim> {
        let inner = self.inner.lock().await;
        let spec = inner.specs.read(uid.as_str()).ok()??;
        drop(inner);
        let (namespace, name) = spec.annotations.get(ANNOTATION_CLAIM)?.split_once('/')?;
        let claim = ClaimRef { namespace: namespace.into(), name: name.into(), uid: uid.clone() };
        let object = self.get_claim(&claim).await.ok()?;
        let devices = devices_of(&object, &claim, &self.config.driver_name, &self.node, published).ok()?;
        Some(PreparedClaim { claim, devices, spec })
    }

    async fn get_claim(&self, claim: &ClaimRef) -> Result<ResourceClaim, PrepareError> {
        if let Some(cache) = &self.cache {
            let key = kube::runtime::reflector::ObjectRef::new(&claim.name).within(&claim.namespace);
            if let Some(c) = cache.get(&key)
                && c.metadata.uid.as_deref() == Some(claim.uid.as_str())
                && c.status.as_ref().is_some_and(|s| s.allocation.is_some())
            {
                return Ok((*c).clone());
            }
        }
        let client =
            self.claims.clone().ok_or_else(|| PrepareError::Api { claim: claim.to_string(), reason: "no API client".into() })?;
        let api: Api<ResourceClaim> = Api::namespaced(client, &claim.namespace);
        match api.get_opt(&claim.name).await {
            Ok(Some(c)) => Ok(c),
            Ok(None) => Err(PrepareError::NotFound(format!("{}/{}", claim.namespace, claim.name))),
            Err(e) => Err(PrepareError::Api { claim: claim.to_string(), reason: e.to_string() }),
        }
    }

    /// Prepares one claim; repeating it returns the same answer and restores a lost spec.
    ///
    /// # Errors
    /// [`PrepareError`] for this claim only.
    pub async fn prepare(&self, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, PrepareError> {
        if let Some(answer) = self.prepared_answer(claim).await? {
            return Ok(answer);
        }
        let object = self.get_claim(claim).await?;
        let published = self.published()?;
        let devices = devices_of(&object, claim, &self.config.driver_name, &self.node, &published)?;
        let mut inner = self.inner.lock().await;
        let Inner { ledger, prepared, checkpoint, specs, cdi } = &mut *inner;
        if prepared.contains_key(&claim.uid) {
            drop(inner);
            return self
                .prepared_answer(claim)
                .await?
                .ok_or_else(|| PrepareError::Storage("claim vanished while preparing".into()));
        }
        let spec = build_spec(cdi, claim, &devices, &published).map_err(|e| PrepareError::Storage(e.to_string()))?;
        ledger.set_capacity(capacities(&published));
        let mut admitted = Vec::new();
        for d in &devices {
            if let Err(e) = ledger.admit(d.key(&claim.uid), d.consumption.clone()) {
                admitted.iter().for_each(|k| {
                    ledger.release(k);
                });
                return Err(e.into());
            }
            admitted.push(d.key(&claim.uid));
        }
        fail_point(self.fail_at, FailPoint::PrepareAdmitted);
        let entry = PreparedClaim { claim: claim.clone(), devices, spec };
        prepared.insert(claim.uid.clone(), entry.clone());
        let written = async {
            blocking(|| checkpoint.record(&entry)).map_err(|e| format!("{e:#}"))?;
            fail_point(self.fail_at, FailPoint::PrepareCheckpointed);
            ensure_dir(&claim_dir(cdi, claim)).await.map_err(|e| format!("{e:#}"))?;
            blocking(|| specs.write(claim.uid.as_str(), &entry.spec)).map_err(|e| format!("{:#}", anyhow::Error::from(e)))?;
            fail_point(self.fail_at, FailPoint::PrepareSpecWritten);
            Ok::<_, String>(())
        }
        .await;
        if let Err(e) = written {
            prepared.remove(&claim.uid);
            admitted.iter().for_each(|k| {
                ledger.release(k);
            });
            let _ = blocking(|| checkpoint.forget(&claim.uid));
            return Err(PrepareError::Storage(e));
        }
        Ok(answer(cdi, &published, &self.node, &entry))
    }

    /// The stored answer of an already prepared claim, with its spec restored when missing.
    async fn prepared_answer(&self, claim: &ClaimRef) -> Result<Option<Vec<PreparedDevice>>, PrepareError> {
        let inner = self.inner.lock().await;
        let Some(entry) = inner.prepared.get(&claim.uid) else { return Ok(None) };
        let storage = |e: &dyn std::fmt::Display| PrepareError::Storage(e.to_string());
        if blocking(|| inner.specs.read(claim.uid.as_str())).map_err(|e| storage(&e))?.is_none() {
            tracing::info!(claim = %claim, "CDI spec vanished (tmpfs after reboot?); rewriting it");
            ensure_dir(&claim_dir(&inner.cdi, claim)).await.map_err(|e| storage(&e))?;
            blocking(|| inner.specs.write(claim.uid.as_str(), &entry.spec)).map_err(|e| storage(&e))?;
        }
        let published = self.published()?;
        Ok(Some(answer(&inner.cdi, &published, &self.node, entry)))
    }

    /// Unprepares one claim; unknown claims succeed.
    ///
    /// # Errors
    /// When the checkpoint or spec cannot be written (the kubelet retries).
    pub async fn unprepare(&self, uid: &Uid) -> Result<(), PrepareError> {
        let mut inner = self.inner.lock().await;
        let Inner { ledger, prepared, checkpoint, specs, cdi } = &mut *inner;
        if let Some(entry) = prepared.remove(uid) {
            if let Err(e) = blocking(|| checkpoint.forget(uid)) {
                prepared.insert(uid.clone(), entry);
                return Err(PrepareError::Storage(e.to_string()));
            }
            ledger.release_claim(uid);
            fail_point(self.fail_at, FailPoint::UnprepareCheckpointed);
        }
        if blocking(|| specs.remove(uid.as_str())).map_err(|e| PrepareError::Storage(e.to_string()))? {
            fail_point(self.fail_at, FailPoint::UnprepareSpecRemoved);
        }
        match tokio::fs::remove_dir_all(cdi.claims_root.join(uid.as_str())).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(PrepareError::Storage(e.to_string())),
            _ => Ok(()),
        }
    }

    /// The ledger's view, for metrics and tests: device -> capacity -> used.
    pub async fn usage(&self) -> BTreeMap<DeviceName, vgpu_scheduling::Consumption> {
        let inner = self.inner.lock().await;
        let devices: std::collections::BTreeSet<DeviceName> = inner.ledger.shares().map(|(k, _)| k.device.clone()).collect();
        devices.into_iter().map(|d| (d.clone(), inner.ledger.used(&d))).collect()
    }

    /// Every prepared share with its claim and, when the claim cache knows it, the pod the claim
    /// is reserved for: what per-pod metrics report.
    pub async fn shares(&self) -> Vec<ShareUsage> {
        let prepared: Vec<PreparedClaim> = self.inner.lock().await.prepared.values().cloned().collect();
        prepared
            .into_iter()
            .flat_map(|p| {
                let pod = self.consumer_of(&p.claim);
                p.devices.into_iter().map(move |d| ShareUsage {
                    claim: p.claim.clone(),
                    pod: pod.clone(),
                    device: d.device,
                    consumption: d.consumption,
                })
            })
            .collect()
    }

    /// The pod a claim is reserved for, from the watch cache only (metrics never call the API).
    fn consumer_of(&self, claim: &ClaimRef) -> Option<String> {
        let key = kube::runtime::reflector::ObjectRef::new(&claim.name).within(&claim.namespace);
        let object = self.cache.as_ref()?.get(&key)?;
        let reserved = object.status.as_ref()?.reserved_for.as_ref()?;
        reserved.iter().find(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty()).map(|r| r.name.clone())
    }

    /// How many claims are prepared.
    pub async fn prepared_count(&self) -> usize {
        self.inner.lock().await.prepared.len()
    }
}

fn capacities(published: &[PublishedDevice]) -> BTreeMap<DeviceName, vgpu_scheduling::Consumption> {
    published.iter().map(|d| (d.name.clone(), d.capacity_values())).collect()
}

fn answer(cdi: &CdiOptions, published: &[PublishedDevice], node: &str, entry: &PreparedClaim) -> Vec<PreparedDevice> {
    let kind = &cdi.kind;
    let toolkit = super::toolkit::toolkit_devices(&cdi.toolkit_dirs, &format!("{}_", kind.file_stem()));
    entry
        .devices
        .iter()
        .zip(&entry.spec.devices)
        .map(|(d, spec_dev)| {
            let id = cdi_spec::DeviceName::new(spec_dev.name.clone())
                .map(|name| QualifiedDeviceId { kind: kind.clone(), name }.to_string());
            let card = published.iter().find(|p| p.name == d.device);
            let toolkit_id = card.and_then(|c| {
                let index = match c.attributes.get("index") {
                    Some(vgpu_scheduling::Attribute::Int(i)) => u32::try_from(*i).unwrap_or(c.minor),
                    _ => c.minor,
                };
                super::toolkit::toolkit_id(&toolkit, &c.uuid, index)
            });
            PreparedDevice {
                request: d.request.clone(),
                pool: node.to_owned(),
                device: d.device.to_string(),
                cdi_ids: id.into_iter().chain(toolkit_id).collect(),
                consumed: d.consumption.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","),
                share_id: d.share_id.as_ref().map(ToString::to_string),
            }
        })
        .collect()
}

/// Runs small synchronous file work (fsync included) without stalling the runtime's other tasks.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

async fn ensure_dir(path: &std::path::Path) -> std::io::Result<()> {
    tokio::fs::create_dir_all(path).await
}
