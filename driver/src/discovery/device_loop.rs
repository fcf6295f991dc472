//! The device loop: one OS thread that reads the inventory every poll, card by card, and publishes
//! each complete read as a snapshot.
//!
//! Every read runs on a worker thread of its own (one for the card list, one per card) and is
//! waited for until a deadline. A card whose read fails or does not answer in time is reported
//! unhealthy with its last known details, while the other cards are read as usual; a card whose
//! call hangs is not asked again until that call returns, so hung calls never pile up. A card list
//! that cannot be read marks every card unhealthy: without it nothing about the cards is known.
//! Nothing here runs on the async runtime.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use vgpu_scheduling::{Gpu, Health, Inventory};

use super::snapshot::SnapshotSource;
use super::source::{CardList, DeviceSource, DiscoveryError};
use super::worker::{Start, Worker};

/// How long one read may take before its card is reported unhealthy. NVML answers in
/// milliseconds; a wedged card (XID 79, a stuck GSP) can block a call for minutes, and the
/// kubelet should hear of it well within its own health timeout. The margin covers a slow first
/// query on a card without persistence mode.
pub const READ_DEADLINE: Duration = Duration::from_secs(5);

/// Timing of the device loop.
#[derive(Debug, Clone)]
pub struct DeviceLoopOptions {
    /// Pause between the end of one round of reads and the start of the next.
    pub poll: Duration,
    /// The deadline of each read ([`READ_DEADLINE`] by default).
    pub deadline: Duration,
}

impl Default for DeviceLoopOptions {
    fn default() -> Self {
        Self { poll: Duration::from_secs(5), deadline: READ_DEADLINE }
    }
}

/// The running loop; dropping it stops the loop after its current round (the worker threads
/// follow once their calls return).
#[derive(Debug)]
pub struct DeviceLoop {
    /// Dropped to stop the loop: its thread waits on the other end between rounds.
    _stop: mpsc::Sender<()>,
    snapshots: SnapshotSource,
}

impl DeviceLoop {
    /// Starts reading `source`; the first round begins at once.
    ///
    /// # Errors
    /// When the loop's thread cannot be created.
    pub fn start(source: Arc<dyn DeviceSource>, options: DeviceLoopOptions) -> std::io::Result<Self> {
        let (tx, rx) = watch::channel(None);
        let (stop, stopped) = mpsc::channel::<()>();
        let mut reader = Reader::new(source, options.deadline);
        std::thread::Builder::new().name("gpu-loop".into()).spawn(move || {
            loop {
                if let Some(inventory) = reader.round() {
                    tx.send_if_modified(|current| {
                        let changed = current.as_ref() != Some(&inventory);
                        if changed {
                            *current = Some(inventory);
                        }
                        changed
                    });
                }
                if !matches!(stopped.recv_timeout(options.poll), Err(RecvTimeoutError::Timeout)) {
                    return;
                }
            }
        })?;
        Ok(Self { _stop: stop, snapshots: SnapshotSource::new(rx) })
    }

    /// The snapshots as a [`DeviceSource`] without I/O; clones share the channel.
    pub fn source(&self) -> SnapshotSource {
        self.snapshots.clone()
    }
}

type CardRead = Result<Gpu, DiscoveryError>;

/// One card as the loop knows it.
#[derive(Default)]
struct Card {
    worker: Option<Worker<CardRead>>,
    /// The details of its last good read.
    known: Option<Gpu>,
    /// Why its last read failed, to log each trouble once.
    trouble: Option<String>,
}

impl Card {
    /// The card to publish after a read: the read itself, or the last known details marked
    /// unhealthy (nothing when the card was never read).
    fn settle(&mut self, index: u32, read: Result<Gpu, String>) -> Option<Gpu> {
        match read {
            Ok(gpu) => {
                if self.trouble.take().is_some() {
                    tracing::info!(index, uuid = %gpu.uuid, "GPU answers again");
                }
                self.known = Some(gpu.clone());
                Some(gpu)
            }
            Err(why) => {
                if self.trouble.as_deref() != Some(why.as_str()) {
                    let uuid = self.known.as_ref().map(|g| g.uuid.as_str()).unwrap_or("never read");
                    tracing::warn!(index, %uuid, reason = %why, "GPU cannot be read; reported unhealthy with its last known details");
                }
                self.trouble = Some(why);
                let mut gpu = self.known.clone()?;
                gpu.health = Health::Unhealthy;
                Some(gpu)
            }
        }
    }
}

/// The state of the loop between rounds.
struct Reader {
    source: Arc<dyn DeviceSource>,
    deadline: Duration,
    list: Option<Worker<Result<CardList, DiscoveryError>>>,
    list_trouble: Option<String>,
    cards: BTreeMap<u32, Card>,
    last: Option<Inventory>,
}

impl Reader {
    fn new(source: Arc<dyn DeviceSource>, deadline: Duration) -> Self {
        Self { source, deadline, list: None, list_trouble: None, cards: BTreeMap::new(), last: None }
    }

    fn hung(&self) -> String {
        format!("no answer within {:?}; not asked again until the call returns", self.deadline)
    }

    /// One round: the card list, then every card at once under one deadline. `None` until a
    /// first card list has been read.
    fn round(&mut self) -> Option<Inventory> {
        let list = match self.read_list() {
            Ok(list) => {
                if self.list_trouble.take().is_some() {
                    tracing::info!("the GPU list can be read again");
                }
                list
            }
            Err(why) => {
                if self.list_trouble.as_deref() != Some(why.as_str()) {
                    tracing::warn!(reason = %why, "cannot list the GPUs; every card is reported unhealthy");
                }
                self.list_trouble = Some(why);
                let mut inventory = self.last.clone()?;
                inventory.gpus.iter_mut().for_each(|g| g.health = Health::Unhealthy);
                return Some(inventory);
            }
        };
        self.cards.retain(|index, _| list.indices.contains(index));
        let begun: Vec<(u32, Result<(), String>)> = list.indices.iter().map(|&index| (index, self.begin_card(index))).collect();
        let deadline = Instant::now() + self.deadline;
        let hung = self.hung();
        let mut gpus = Vec::with_capacity(begun.len());
        for (index, begun) in begun {
            let card = self.cards.entry(index).or_default();
            let read = begun.and_then(|()| match card.worker.as_mut().and_then(|w| w.answer(deadline)) {
                Some(Ok(gpu)) => Ok(gpu),
                Some(Err(e)) => Err(e.to_string()),
                None => Err(hung.clone()),
            });
            gpus.extend(card.settle(index, read));
        }
        let inventory = Inventory { driver_version: list.driver_version, cuda_driver_version: list.cuda_driver_version, gpus };
        self.last = Some(inventory.clone());
        Some(inventory)
    }

    fn read_list(&mut self) -> Result<CardList, String> {
        let source = self.source.clone();
        begin(&mut self.list, "gpu-list", || {
            let source = source.clone();
            move || source.cards()
        })
        .map_err(|why| self.why_not_started(why))?;
        match self.list.as_mut().and_then(|w| w.answer(Instant::now() + self.deadline)) {
            Some(Ok(list)) => Ok(list),
            Some(Err(e)) => Err(e.to_string()),
            None => Err(self.hung()),
        }
    }

    fn begin_card(&mut self, index: u32) -> Result<(), String> {
        let source = self.source.clone();
        let card = self.cards.entry(index).or_default();
        begin(&mut card.worker, &format!("gpu-card-{index}"), || {
            let source = source.clone();
            move || source.card(index)
        })
        .map_err(|why| self.why_not_started(why))
    }

    fn why_not_started(&self, why: NotStarted) -> String {
        match why {
            NotStarted::StillRunning => self.hung(),
            NotStarted::Thread(reason) => reason,
        }
    }
}

/// Why no read was started.
enum NotStarted {
    /// The previous call has not returned.
    StillRunning,
    /// No thread could run it.
    Thread(String),
}

/// Starts a call on the worker in `slot`, creating the worker (or replacing a dead one) with a
/// call made by `make`.
fn begin<T, F>(slot: &mut Option<Worker<T>>, name: &str, make: impl Fn() -> F) -> Result<(), NotStarted>
where
    T: Send + 'static,
    F: Fn() -> T + Send + 'static,
{
    // A worker whose call panicked is replaced once per round.
    for _ in 0..2 {
        let worker = match slot {
            Some(worker) => worker,
            None => slot.insert(
                Worker::spawn(name.to_owned(), make())
                    .map_err(|e| NotStarted::Thread(format!("cannot start thread {name}: {e}")))?,
            ),
        };
        match worker.start() {
            Start::Started => return Ok(()),
            Start::StillRunning => return Err(NotStarted::StillRunning),
            Start::Gone => *slot = None,
        }
    }
    Err(NotStarted::Thread(format!("thread {name} keeps dying")))
}

#[cfg(test)]
mod tests;
