//! The node monitor: every tick it reads the HAMi-core region of each claim prepared on the
//! node, applies HAMi's feedback (task priority, idle-card bursting; see [`feedback`]) by writing
//! two fields of the regions the driver created, and exports each claim's usage ([`metrics`]).
//!
//! What a region says is the tenant's word: it is read as hostile bytes ([`file`], [`region`]),
//! and everything the monitor decides on comes from the claim as the driver prepared it (its
//! cards, its limits, its priority and policy, read from its CDI spec), never from the file.
//! A bad region is skipped, counted and logged once per claim; the others are unaffected.

pub mod feedback;
pub mod file;
pub mod metrics;
pub mod region;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use vgpu_scheduling::Uid;

use self::feedback::{Policy, Seen, SwitchMode};
use self::file::FileError;
use self::metrics::{CardFigures, MonitorMetrics, SeriesKey};
use self::region::{Region, offset};
use crate::plugin::cdi::{region_file, spec_env};
use crate::plugin::claim::ClaimRef;
use crate::plugin::state::State;
use crate::plugin::storage::held_spec::HeldSpec;

/// HAMi's monitor ticks every 5 s; HAMi-core's "recent kernel" counts in those ticks.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
/// How many claims' pods are looked up per tick, so a restart with many claims spreads its API
/// reads over several ticks.
const LOOKUPS_PER_TICK: usize = 16;
/// How long one pod lookup may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// The monitor's settings.
#[derive(Debug, Clone, Copy)]
pub struct MonitorOptions {
    /// Time between ticks.
    pub interval: Duration,
    /// How `utilization_switch` is set.
    pub switch: SwitchMode,
}

impl Default for MonitorOptions {
    fn default() -> Self {
        Self { interval: DEFAULT_INTERVAL, switch: SwitchMode::Feedback }
    }
}

/// A prepared claim as the monitor watches it, from what the driver wrote into its spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watched {
    /// The claim.
    pub claim: ClaimRef,
    /// Its region file's name in its directory.
    pub file: String,
    /// Its cards, in the order its containers see them.
    pub cards: Vec<String>,
    /// Each card's memory limit in bytes (`CUDA_DEVICE_MEMORY_LIMIT_<i>`).
    pub limits: Vec<u64>,
    /// `CUDA_TASK_PRIORITY`: 0 is high, anything else low.
    pub priority: u8,
    /// `GPU_CORE_UTILIZATION_POLICY`.
    pub policy: Policy,
}

impl Watched {
    /// The watch of `claim` prepared with `spec`; `None` for a spec without a region (not
    /// HAMi-core's).
    pub fn new(claim: &ClaimRef, spec: &HeldSpec) -> Option<Self> {
        let env = spec.env().ok()?;
        let file = region_file(&env)?;
        let cards: Vec<String> =
            spec_env(&env, "NVIDIA_VISIBLE_DEVICES")?.split(',').filter(|c| !c.is_empty()).map(str::to_owned).collect();
        let limits = (0..cards.len())
            .map(|i| {
                spec_env(&env, &format!("CUDA_DEVICE_MEMORY_LIMIT_{i}"))
                    .and_then(|v| v.strip_suffix('m'))
                    .and_then(|mib| mib.parse::<u64>().ok())
                    .map_or(0, |mib| mib.saturating_mul(1 << 20))
            })
            .collect();
        let priority = match spec_env(&env, "CUDA_TASK_PRIORITY").map(|v| v.trim().parse::<i64>()) {
            Some(Ok(p)) if p <= 0 => feedback::HIGH,
            _ => feedback::LOW,
        };
        let policy = spec_env(&env, "GPU_CORE_UTILIZATION_POLICY").map_or(Policy::Default, Policy::from_env);
        Some(Self { claim: claim.clone(), file, cards, limits, priority, policy })
    }
}

/// What one claim's region gave this tick.
#[derive(Debug)]
pub enum Outcome {
    /// Read; the region as read.
    Read(Region),
    /// Not read, and why.
    Skipped(FileError),
}

/// One tick's result.
#[derive(Debug, Default)]
pub struct Tick {
    /// Each watched claim's outcome, in the order given.
    pub outcomes: Vec<Outcome>,
    /// Blocked after this tick.
    pub blocked: Vec<Uid>,
    /// Allowed past their SM limit after this tick.
    pub bursting: Vec<Uid>,
    /// Fields written.
    pub writes: Vec<(Uid, &'static str, i32)>,
    /// Claims whose region needed a write but is not the driver's file.
    pub foreign: Vec<Uid>,
}

/// Reads every watched region under `claims_root`, applies HAMi's rules to all of them at once,
/// and writes what changed (blocking: file I/O only).
pub fn feed(claims_root: &Path, watched: &[Watched], mode: SwitchMode) -> Tick {
    let mut tick = Tick::default();
    let root = match file::ClaimsRoot::open(claims_root) {
        Ok(root) => root,
        Err(e) => {
            tick.outcomes =
                watched.iter().map(|_| Outcome::Skipped(file::FileError::Io { op: "open claims root", errno: e })).collect();
            return tick;
        }
    };
    let mut seen = Vec::new();
    for (i, w) in watched.iter().enumerate() {
        let outcome = match root.open_region(w.claim.uid.as_str(), &w.file).and_then(|f| f.read()) {
            Ok(region) => {
                seen.push(Seen {
                    key: i,
                    cards: w.cards.clone(),
                    priority: w.priority,
                    policy: w.policy,
                    recent_kernel: region.recent_kernel,
                    utilization_switch: region.utilization_switch,
                });
                Outcome::Read(region)
            }
            Err(e) => Outcome::Skipped(e),
        };
        tick.outcomes.push(outcome);
    }
    for d in feedback::tick(&seen, mode) {
        let w = &watched[d.key];
        let uid = w.claim.uid.clone();
        if d.blocked {
            tick.blocked.push(uid.clone());
        }
        if !d.throttled {
            tick.bursting.push(uid.clone());
        }
        if d.writes.is_empty() {
            continue;
        }
        // Opened again, with every check: the name may hold another file since the read.
        match root.open_region(uid.as_str(), &w.file) {
            Ok(f) if f.ours => {
                let fields = [("recent_kernel", offset::RECENT_KERNEL, d.writes.recent_kernel)];
                let fields =
                    fields.into_iter().chain([("utilization_switch", offset::UTILIZATION_SWITCH, d.writes.utilization_switch)]);
                for (name, at, value) in fields {
                    if let Some(v) = value
                        && f.write_i32(at, v).is_ok()
                    {
                        tick.writes.push((uid.clone(), name, v));
                    }
                }
            }
            Ok(_) => tick.foreign.push(uid),
            Err(_) => {}
        }
    }
    tick
}

/// The series of one tick: for each claim whose region was read, one per card, labelled with
/// its pod and containers where `consumers` knows them; `now` in seconds since the epoch.
pub fn figures(
    watched: &[Watched],
    outcomes: &[Outcome],
    consumers: &BTreeMap<Uid, (String, String)>,
    now: u64,
) -> Vec<(SeriesKey, CardFigures)> {
    let mut figures = Vec::new();
    for (w, outcome) in watched.iter().zip(outcomes) {
        let Outcome::Read(region) = outcome else { continue };
        let (pod, container) = consumers.get(&w.claim.uid).cloned().unwrap_or_default();
        for (index, uuid) in w.cards.iter().enumerate() {
            let key = SeriesKey {
                namespace: w.claim.namespace.to_string(),
                pod: pod.clone(),
                container: container.clone(),
                claim_uid: w.claim.uid.to_string(),
                index,
                uuid: uuid.clone(),
            };
            let card = CardFigures {
                usage: region.usage.get(index).copied().unwrap_or_default(),
                limit: w.limits.get(index).copied().unwrap_or(0),
                since_last_kernel: (region.last_kernel_time > 0).then(|| now.saturating_sub(region.last_kernel_time)),
            };
            figures.push((key, card));
        }
    }
    figures
}

/// The monitor task.
pub struct Monitor {
    state: Arc<State>,
    claims_root: PathBuf,
    options: MonitorOptions,
    metrics: MonitorMetrics,
    /// Each claim's pod and containers, once looked up.
    consumers: BTreeMap<Uid, (String, String)>,
    /// The last problem logged per claim, so each is logged once.
    reported: BTreeMap<Uid, String>,
}

impl Monitor {
    /// A monitor of `state`'s claims, whose directories are under `claims_root`.
    pub fn new(state: Arc<State>, claims_root: PathBuf, options: MonitorOptions, metrics: MonitorMetrics) -> Self {
        Self { state, claims_root, options, metrics, consumers: BTreeMap::new(), reported: BTreeMap::new() }
    }

    /// Ticks until cancelled.
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut every = tokio::time::interval(self.options.interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = every.tick() => {}
            }
            self.tick().await;
        }
    }

    /// One tick: the prepared claims, their pods where still unknown, the regions, the metrics.
    pub async fn tick(&mut self) -> Tick {
        let started = Instant::now();
        // Copied under the state's lock, read outside it and off the runtime: a tick never
        // holds a prepare up while it parses a thousand specs.
        let held = self.state.each_prepared(|p| Some((p.claim.clone(), p.spec.clone()))).await;
        let read = tokio::task::spawn_blocking(move || {
            held.iter().filter_map(|(claim, spec)| Watched::new(claim, spec)).collect::<Vec<_>>()
        });
        let watched = match read.await {
            Ok(watched) => watched,
            Err(e) => {
                tracing::error!(error = %e, "monitor tick failed reading the prepared claims");
                return Tick::default();
            }
        };
        let prepared: std::collections::BTreeSet<&Uid> = watched.iter().map(|w| &w.claim.uid).collect();
        self.consumers.retain(|uid, _| prepared.contains(uid));
        self.reported.retain(|uid, _| prepared.contains(uid));
        self.look_up_consumers(&watched).await;
        let (root, mode) = (self.claims_root.clone(), self.options.switch);
        let shared = Arc::new(watched);
        let for_io = shared.clone();
        let tick = match tokio::task::spawn_blocking(move || feed(&root, &for_io, mode)).await {
            Ok(tick) => tick,
            Err(e) => {
                tracing::error!(error = %e, "monitor tick failed");
                return Tick::default();
            }
        };
        self.report(&shared, &tick);
        self.metrics.tick.observe(started.elapsed().as_secs_f64());
        tick
    }

    async fn look_up_consumers(&mut self, watched: &[Watched]) {
        let missing: Vec<&Watched> =
            watched.iter().filter(|w| !self.consumers.contains_key(&w.claim.uid)).take(LOOKUPS_PER_TICK).collect();
        for w in missing {
            match tokio::time::timeout(LOOKUP_TIMEOUT, self.state.consumer_of(&w.claim)).await {
                Ok(Ok(Some((pod, containers)))) => {
                    self.consumers.insert(w.claim.uid.clone(), (pod, containers.join(",")));
                }
                Ok(Ok(None)) => {}
                Ok(Err(e)) => tracing::debug!(claim = %w.claim, error = %e.chain(), "pod of a prepared claim not found yet"),
                Err(_) => tracing::debug!(claim = %w.claim, "looking up the pod of a prepared claim timed out"),
            }
        }
    }

    fn report(&mut self, watched: &[Watched], tick: &Tick) {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let figures = figures(watched, &tick.outcomes, &self.consumers, now);
        for (w, outcome) in watched.iter().zip(&tick.outcomes) {
            let problem = match outcome {
                Outcome::Read(_) if tick.foreign.contains(&w.claim.uid) => {
                    Some(("the region is not the file the driver created; no feedback is written".to_owned(), "foreign"))
                }
                Outcome::Skipped(e) if e.is_bad() => Some((e.to_string(), e.reason())),
                Outcome::Read(_) | Outcome::Skipped(_) => None,
            };
            let Some((said, reason)) = problem else {
                self.reported.remove(&w.claim.uid);
                continue;
            };
            if self.reported.get(&w.claim.uid) != Some(&said) {
                tracing::warn!(claim = %w.claim, file = %w.file, problem = %said, "the claim's HAMi-core region");
                self.metrics.bad_regions.get_or_create(&crate::metrics::labels(&[("reason", reason)])).inc();
                self.reported.insert(w.claim.uid.clone(), said);
            }
        }
        for (uid, field, value) in &tick.writes {
            tracing::debug!(claim = %uid, field, value, "region feedback");
            self.metrics.writes.get_or_create(&crate::metrics::labels(&[("field", field)])).inc();
        }
        self.metrics.blocked.set(i64::try_from(tick.blocked.len()).unwrap_or(i64::MAX));
        self.metrics.bursting.set(i64::try_from(tick.bursting.len()).unwrap_or(i64::MAX));
        self.metrics.show(figures);
    }
}

#[cfg(test)]
mod tests;
