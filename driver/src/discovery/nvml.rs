//! Discovery through NVML. `libnvidia-ml.so` is loaded at run time, so a node without the NVIDIA
//! driver gets a clear error instead of a crash at start. Read-only: nothing here changes a GPU's
//! settings.

use std::sync::atomic::{AtomicBool, Ordering};

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use vgpu_scheduling::{Gpu, Health, Inventory, MigDevice};

use super::source::{CardList, DeviceSource, DiscoveryError, read_all};
use crate::mig::nvml::{CallError, gpu_instance_placement, instance_ids};

/// NVML's "MIG enabled" mode value.
const MIG_ENABLED: u32 = 1;
/// More MIG instances than any card supports: the scan stops at the first missing index.
const MAX_MIG_SCAN: u32 = 8;

/// The NVML device source; holds the loaded library. NVML may be called from several threads
/// at once, so the device loop reads each card on a thread of its own.
pub struct NvmlSource {
    nvml: Nvml,
    /// Cards a critical XID has marked unhealthy; `None` for one-shot reads.
    xid: Option<super::xid::XidWatch>,
    /// Whether a MIG instance's placement could not be read before: said once as a warning,
    /// then at debug level, since every poll would say it again.
    placement_warned: AtomicBool,
}

impl std::fmt::Debug for NvmlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NvmlSource")
    }
}

impl NvmlSource {
    /// Loads and initialises NVML.
    ///
    /// # Errors
    /// [`DiscoveryError::NvmlUnavailable`] when the library or driver is missing.
    pub fn new() -> Result<Self, DiscoveryError> {
        Nvml::init()
            .map(|nvml| Self { nvml, xid: None, placement_warned: AtomicBool::new(false) })
            .map_err(|e| DiscoveryError::NvmlUnavailable(describe(&e)))
    }

    /// Also watches XID events, so a card that faults turns unhealthy without waiting for NVML
    /// to lose it: for the daemon, not for one-shot reads.
    #[must_use]
    pub fn watching_xids(mut self) -> Self {
        self.xid = Some(super::xid::XidWatch::start());
        self
    }
}

/// One line for an NVML error, saying what the operator can do about the common ones.
fn describe(e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(_) => {
            "libnvidia-ml.so could not be loaded (no NVIDIA driver on this node?); use --mock-gpus or --mock-inventory on GPU-less nodes".into()
        }
        NvmlError::DriverNotLoaded => "the NVIDIA kernel driver is not loaded".into(),
        NvmlError::NoPermission => "no permission to use NVML (is /dev/nvidiactl accessible?)".into(),
        other => other.to_string(),
    }
}

fn step<T>(what: &'static str, r: Result<T, NvmlError>) -> Result<T, DiscoveryError> {
    r.map_err(|e| DiscoveryError::Nvml { what, reason: describe(&e) })
}

impl DeviceSource for NvmlSource {
    fn inventory(&self) -> Result<Inventory, DiscoveryError> {
        read_all(self)
    }

    fn cards(&self) -> Result<CardList, DiscoveryError> {
        let nvml = &self.nvml;
        let driver_version = step("driver version", nvml.sys_driver_version())?;
        let cuda = step("CUDA driver version", nvml.sys_cuda_driver_version())?;
        let cuda_major = u32::try_from(cuda / 1000).unwrap_or(0);
        let cuda_minor = u32::try_from((cuda % 1000) / 10).unwrap_or(0);
        // NVML counts lost cards too, so they are read (and reported) rather than hidden.
        let count = step("device count", nvml.device_count())?;
        Ok(CardList { driver_version, cuda_driver_version: (cuda_major, cuda_minor), indices: (0..count).collect() })
    }

    fn card(&self, index: u32) -> Result<Gpu, DiscoveryError> {
        let dev = match self.nvml.device_by_index(index) {
            Ok(dev) => dev,
            Err(NvmlError::GpuLost) => return Err(DiscoveryError::CardLost { index }),
            Err(e) => return Err(DiscoveryError::Nvml { what: "device handle", reason: describe(&e) }),
        };
        let cc = step("compute capability", dev.cuda_compute_capability())?;
        let mig = match dev.mig_mode() {
            Ok(mode) if mode.current == MIG_ENABLED => Some(self.mig_devices(&dev)?),
            _ => None,
        };
        let mut gpu = Gpu {
            uuid: step("uuid", dev.uuid())?,
            minor: step("minor number", dev.minor_number())?,
            index,
            product_name: step("name", dev.name())?,
            brand: dev.brand().map(|b| format!("{b:?}")).unwrap_or_default(),
            memory_bytes: step("memory info", dev.memory_info())?.total,
            architecture: dev.architecture().map(|a| a.to_string()).unwrap_or_default(),
            compute_capability: (u32::try_from(cc.major).unwrap_or(0), u32::try_from(cc.minor).unwrap_or(0)),
            pci_bus_id: step("PCI info", dev.pci_info())?.bus_id.to_lowercase(),
            pcie_root: None,
            multiprocessors: 0,
            mig,
            health: Health::Healthy,
        };
        if let Some(watch) = &self.xid {
            watch.marks().apply_to(&mut gpu);
        }
        Ok(gpu)
    }
}

impl NvmlSource {
    fn mig_devices(&self, parent: &nvml_wrapper::Device<'_>) -> Result<Vec<MigDevice>, DiscoveryError> {
        let mut out = Vec::new();
        for i in 0..MAX_MIG_SCAN {
            let Ok(mig) = parent.mig_device_by_index(i) else { continue };
            let name = step("MIG name", mig.name())?;
            // NVML names MIG devices "<product> MIG <profile>".
            let profile = name.rsplit_once("MIG ").map_or(name.as_str(), |(_, p)| p).to_owned();
            let uuid = step("MIG uuid", mig.uuid())?;
            // The instance's ids and its GPU instance's placement, so dynamic MIG offers only
            // the placements left free. Where they cannot be read, the instance keeps its scan
            // index as GPU instance and no placement, as before; such a card offers no dynamic
            // MIG.
            let ids = instance_ids(&mig);
            let placement = ids.as_ref().map_err(Clone::clone).and_then(|&(gi, _)| gpu_instance_placement(parent, gi));
            if let Err(e) = &placement {
                self.placement_unread(&uuid, e);
            }
            let (gpu_instance, compute_instance) = ids.unwrap_or((i, 0));
            out.push(MigDevice {
                uuid,
                profile,
                gpu_instance,
                compute_instance,
                memory_bytes: step("MIG memory info", mig.memory_info())?.total,
                multiprocessors: 0,
                placement: placement.ok(),
            });
        }
        Ok(out)
    }

    fn placement_unread(&self, uuid: &str, e: &CallError) {
        if self.placement_warned.swap(true, Ordering::Relaxed) {
            tracing::debug!(%uuid, error = %e, "MIG instance placement unread");
        } else {
            tracing::warn!(%uuid, error = %e, "cannot read a MIG instance's placement; its card offers no dynamic MIG (said once)");
        }
    }
}
