//! NVML XID events: a critical XID that means the card is lost or must be reset marks it
//! unhealthy until the driver restarts (an operator resets the card, then restarts the pod).
//! XIDs that an application causes on an otherwise sound card are logged and ignored.
//!
//! NVML's event set borrows its library handle and its wait blocks, so the watcher is one OS
//! thread that owns its own NVML handle (NVML counts initialisations) and never touches the
//! async runtime; it stops within a wait timeout of being dropped.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vgpu_scheduling::{Gpu, Health, Inventory};

/// XIDs raised by an application's own faults (illegal access, exceptions, timeouts the
/// program caused): the card stays usable, as NVIDIA's device plugin also treats them.
const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];
/// How long one wait for an event lasts; also the longest a stop request waits.
const WAIT: Duration = Duration::from_millis(1000);

/// Whether XID `xid` means the card can no longer be trusted (unknown XIDs count as such).
pub fn is_fatal(xid: Option<u64>) -> bool {
    xid.is_none_or(|x| !APPLICATION_XIDS.contains(&x))
}

/// Cards marked unhealthy by an XID, by UUID, with the XID seen.
#[derive(Debug, Clone, Default)]
pub struct XidMarks(Arc<Mutex<BTreeMap<String, Option<u64>>>>);

impl XidMarks {
    /// Records a fatal XID on card `uuid`; returns whether the card was healthy before.
    pub fn mark(&self, uuid: &str, xid: Option<u64>) -> bool {
        self.0.lock().is_ok_and(|mut m| m.insert(uuid.to_owned(), xid).is_none())
    }

    /// Marks the cards with a fatal XID unhealthy in `inventory`.
    pub fn apply(&self, inventory: &mut Inventory) {
        inventory.gpus.iter_mut().for_each(|gpu| self.apply_to(gpu));
    }

    /// Marks `gpu` unhealthy when it had a fatal XID.
    pub fn apply_to(&self, gpu: &mut Gpu) {
        if self.0.lock().is_ok_and(|marks| marks.contains_key(&gpu.uuid)) {
            gpu.health = Health::Unhealthy;
        }
    }
}

/// The watcher thread; dropping it stops the thread.
pub struct XidWatch {
    marks: XidMarks,
    stop: Arc<AtomicBool>,
}

impl XidWatch {
    /// Starts watching every card's critical XIDs. Cards that cannot report them are logged
    /// and left unwatched; with none to watch no thread runs.
    pub fn start() -> Self {
        let (marks, stop) = (XidMarks::default(), Arc::new(AtomicBool::new(false)));
        let (m, s) = (marks.clone(), stop.clone());
        let spawned = std::thread::Builder::new().name("nvml-xid".into()).spawn(move || watch(&m, &s));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the XID watcher; card faults are seen only when NVML loses the card");
        }
        Self { marks, stop }
    }

    /// The marks the watcher records.
    pub fn marks(&self) -> &XidMarks {
        &self.marks
    }
}

impl Drop for XidWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn watch(marks: &XidMarks, stop: &AtomicBool) {
    use nvml_wrapper::bitmasks::event::EventTypes;
    use nvml_wrapper::enums::event::XidError;
    use nvml_wrapper::error::NvmlError;

    let nvml = match nvml_wrapper::Nvml::init() {
        Ok(n) => n,
        Err(e) => return tracing::warn!(error = %e, "XID watcher: NVML unavailable"),
    };
    let mut set = match nvml.create_event_set() {
        Ok(s) => s,
        Err(e) => return tracing::warn!(error = %e, "XID watcher: cannot create an NVML event set"),
    };
    let mut watched = 0;
    for index in 0..nvml.device_count().unwrap_or(0) {
        let Ok(dev) = nvml.device_by_index(index) else { continue };
        let supported = dev.supported_event_types().map(|t| t.contains(EventTypes::CRITICAL_XID_ERROR));
        if !matches!(supported, Ok(true)) {
            tracing::warn!(index, "card cannot report XID events; its faults are seen only when NVML loses it");
            continue;
        }
        set = match dev.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(s) => {
                watched += 1;
                s
            }
            Err(e) => return tracing::warn!(index, error = %e.error, "XID watcher: registering events failed"),
        };
    }
    if watched == 0 {
        return;
    }
    tracing::info!(cards = watched, "watching NVML XID events");
    let wait_ms = u32::try_from(WAIT.as_millis()).unwrap_or(1000);
    while !stop.load(Ordering::Relaxed) {
        match set.wait(wait_ms) {
            Ok(event) => {
                let uuid = event.device.uuid().unwrap_or_default();
                let xid = match event.event_data {
                    Some(XidError::Value(x)) => Some(x),
                    _ => None,
                };
                if !is_fatal(xid) {
                    tracing::info!(%uuid, ?xid, "application XID; the card stays healthy");
                } else if marks.mark(&uuid, xid) {
                    tracing::error!(%uuid, ?xid, "critical XID: card marked unhealthy until the driver restarts");
                }
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                tracing::warn!(error = %e, "XID watcher stopped");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::DeviceSource;
    use crate::discovery::mock::{MockSource, mock_uuid, parse_spec};

    #[test]
    fn application_xids_spare_the_card() {
        for x in APPLICATION_XIDS {
            assert!(!is_fatal(Some(x)), "{x}");
        }
        // Fallen off the bus, double-bit ECC, uncontained ECC, GSP error, unknown.
        for x in [Some(79), Some(48), Some(95), Some(119), None] {
            assert!(is_fatal(x), "{x:?}");
        }
    }

    #[test]
    fn marked_cards_turn_unhealthy_and_stay_so() {
        let mut inv = MockSource::new("n1", parse_spec("2xTesla T4:15Gi").unwrap()).inventory().unwrap();
        let marks = XidMarks::default();
        assert!(marks.mark(&mock_uuid("n1", 1), Some(79)));
        assert!(!marks.mark(&mock_uuid("n1", 1), Some(48)), "a second XID on a marked card is not news");
        marks.apply(&mut inv);
        assert_eq!(inv.gpus[0].health, Health::Healthy);
        assert_eq!(inv.gpus[1].health, Health::Unhealthy);
    }
}
