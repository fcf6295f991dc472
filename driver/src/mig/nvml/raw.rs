//! The raw NVML calls of MIG control: each method of [`Raw`] makes one FFI call through
//! nvml-wrapper-sys with pointers to its own locals, and turns the return code into a
//! [`CallError`]. Nothing here decides anything; `super` does, in safe code.

// The workspace denies unsafe code; NVML's MIG calls exist only as raw FFI functions
// (nvml-wrapper 0.13 has no create/destroy of GPU or compute instances), so this one module
// allows it. Every block carries a `SAFETY:` comment, and clippy checks that it does.
#![allow(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::ffi::{CStr, c_char, c_uint};

use nvml_wrapper_sys::bindings as sys;

pub(super) type Dev = sys::nvmlDevice_t;
pub(super) type Gi = sys::nvmlGpuInstance_t;
pub(super) type Ci = sys::nvmlComputeInstance_t;
/// An `NvmlLib` method that reads one `unsigned int` of a device handle.
type UintCall = unsafe fn(&sys::NvmlLib, Dev, *mut c_uint) -> u32;

pub(super) const SUCCESS: u32 = sys::nvmlReturn_enum_NVML_SUCCESS;
pub(super) const NOT_FOUND: u32 = sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
pub(super) const INVALID_ARGUMENT: u32 = sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
pub(super) const NOT_SUPPORTED: u32 = sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
pub(super) const INSUFFICIENT_RESOURCES: u32 = sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES;
/// The code given to answers NVML returned but this module cannot use.
pub(super) const UNKNOWN: u32 = sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN;

/// A failed NVML call: the function, its return code and NVML's text for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {reason} (NVML return code {code})")]
pub struct CallError {
    /// The NVML function.
    pub call: &'static str,
    /// Its return code.
    pub code: u32,
    /// `nvmlErrorString`'s text, or what was wrong with the answer.
    pub reason: String,
}

impl CallError {
    /// An answer NVML gave that cannot be used, under the code `NVML_ERROR_UNKNOWN`.
    pub(super) fn odd(call: &'static str, reason: String) -> Self {
        Self { call, code: UNKNOWN, reason }
    }
}

/// NVML out-parameter structs, zeroed before a call fills them.
///
/// # Safety
/// All-zero bytes must be a valid value of the type.
unsafe trait Plain: Sized {
    fn zeroed() -> Self {
        // SAFETY: the trait's contract.
        unsafe { std::mem::zeroed() }
    }
}
// SAFETY: for each of these bindgen `#[repr(C)]` structs: integers and raw pointers only.
unsafe impl Plain for sys::nvmlGpuInstanceProfileInfo_t {}
// SAFETY: as above.
unsafe impl Plain for sys::nvmlGpuInstanceInfo_t {}
// SAFETY: as above.
unsafe impl Plain for sys::nvmlComputeInstanceProfileInfo_t {}
// SAFETY: as above.
unsafe impl Plain for sys::nvmlComputeInstanceInfo_t {}
// SAFETY: as above.
unsafe impl Plain for sys::nvmlMemory_t {}

/// The raw calls, each checked. Handles stay valid while the `Nvml` behind `lib` lives and the
/// instance they name is not destroyed; every caller holds that `Nvml` for the whole call.
#[derive(Clone, Copy)]
pub(super) struct Raw<'a> {
    lib: &'a sys::NvmlLib,
}

/// Every function [`Raw`] calls: `NvmlMig::with_nvml` refuses a library without one, because
/// nvml-wrapper-sys panics when a missing one is called.
macro_rules! missing_of {
    ($lib:expr; $($f:ident),+ $(,)?) => {
        [$((stringify!($f), $lib.$f.is_err())),+].into_iter().find(|(_, missing)| *missing).map(|(name, _)| name)
    };
}

pub(super) fn first_missing(lib: &sys::NvmlLib) -> Option<&'static str> {
    missing_of!(lib;
        nvmlErrorString, nvmlDeviceGetHandleByUUID, nvmlDeviceGetName, nvmlDeviceGetMemoryInfo,
        nvmlDeviceGetMinorNumber, nvmlDeviceGetMigMode, nvmlDeviceGetGpuInstanceProfileInfo,
        nvmlDeviceGetGpuInstancePossiblePlacements_v2, nvmlDeviceGetGpuInstances,
        nvmlDeviceGetGpuInstanceById, nvmlDeviceCreateGpuInstanceWithPlacement, nvmlGpuInstanceGetInfo,
        nvmlGpuInstanceDestroy, nvmlGpuInstanceGetComputeInstanceProfileInfo,
        nvmlGpuInstanceGetComputeInstances, nvmlGpuInstanceGetComputeInstanceById,
        nvmlGpuInstanceCreateComputeInstance, nvmlComputeInstanceGetInfo_v2, nvmlComputeInstanceDestroy,
        nvmlDeviceGetMaxMigDeviceCount, nvmlDeviceGetMigDeviceHandleByIndex, nvmlDeviceGetGpuInstanceId,
        nvmlDeviceGetComputeInstanceId, nvmlDeviceGetUUID,
    )
}

impl<'a> Raw<'a> {
    /// The calls of a library nvml-wrapper loaded.
    pub(super) fn new(lib: &'a sys::NvmlLib) -> Self {
        Self { lib }
    }

    /// The calls of `device`'s library, and its raw handle, valid while `device` is borrowed.
    pub(super) fn of_device(device: &'a nvml_wrapper::Device<'a>) -> (Self, Dev) {
        // SAFETY: `Device::handle` is unsafe because a raw handle may outlive its `Nvml`; the
        // callers (`instance_ids`, `gpu_instance_placement`) use it only while `device`, and so
        // its `Nvml`, is borrowed.
        (Self { lib: device.nvml().lib() }, unsafe { device.handle() })
    }
}

impl Raw<'_> {
    fn check(self, call: &'static str, code: u32) -> Result<(), CallError> {
        if code == SUCCESS {
            return Ok(());
        }
        // SAFETY: nvmlErrorString takes any code and returns a static string or null.
        let text = unsafe { self.lib.nvmlErrorString(code) };
        let reason = if text.is_null() {
            "no description".to_owned()
        } else {
            // SAFETY: non-null, so it points at a NUL-terminated string that lives as long as the library.
            unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
        };
        Err(CallError { call, code, reason })
    }

    /// Writes into a text buffer of `N` bytes and reads it back (names, UUIDs).
    fn text<const N: usize>(self, call: &'static str, f: impl FnOnce(*mut c_char, c_uint) -> u32) -> Result<String, CallError> {
        let mut buf = [0u8; N];
        self.check(call, f(buf.as_mut_ptr().cast(), c_uint::try_from(N).unwrap_or(0)))?;
        from_buffer(&buf).ok_or_else(|| CallError::odd(call, "the answer is not NUL-terminated UTF-8".into()))
    }

    pub(super) fn device_by_uuid(self, uuid: &CStr) -> Result<Dev, CallError> {
        let mut dev = std::ptr::null_mut();
        // SAFETY: `uuid` is NUL-terminated; `dev` is a local the call writes.
        self.check("nvmlDeviceGetHandleByUUID", unsafe { self.lib.nvmlDeviceGetHandleByUUID(uuid.as_ptr(), &mut dev) })?;
        Ok(dev)
    }

    pub(super) fn name(self, dev: Dev) -> Result<String, CallError> {
        const N: usize = sys::NVML_DEVICE_NAME_V2_BUFFER_SIZE as usize;
        // SAFETY: `buf` and `len` describe a local buffer of `N` bytes.
        self.text::<N>("nvmlDeviceGetName", |buf, len| unsafe { self.lib.nvmlDeviceGetName(dev, buf, len) })
    }

    pub(super) fn uuid(self, dev: Dev) -> Result<String, CallError> {
        const N: usize = sys::NVML_DEVICE_UUID_V2_BUFFER_SIZE as usize;
        // SAFETY: `buf` and `len` describe a local buffer of `N` bytes.
        self.text::<N>("nvmlDeviceGetUUID", |buf, len| unsafe { self.lib.nvmlDeviceGetUUID(dev, buf, len) })
    }

    pub(super) fn memory_total(self, dev: Dev) -> Result<u64, CallError> {
        let mut memory = sys::nvmlMemory_t::zeroed();
        // SAFETY: `memory` is a local struct of the type the call fills.
        self.check("nvmlDeviceGetMemoryInfo", unsafe { self.lib.nvmlDeviceGetMemoryInfo(dev, &mut memory) })?;
        Ok(memory.total)
    }

    /// One `unsigned int` read from a device handle by `f`, one of `NvmlLib`'s methods.
    fn device_uint(self, call: &'static str, f: UintCall, dev: Dev) -> Result<u32, CallError> {
        let mut out: c_uint = 0;
        // SAFETY: `f` is one of the `NvmlLib` methods below, each reading the live handle `dev`
        // and writing one `unsigned int` to `out`, a local.
        self.check(call, unsafe { f(self.lib, dev, &mut out) })?;
        Ok(out)
    }

    pub(super) fn minor(self, dev: Dev) -> Result<u32, CallError> {
        self.device_uint("nvmlDeviceGetMinorNumber", sys::NvmlLib::nvmlDeviceGetMinorNumber, dev)
    }

    pub(super) fn max_mig_devices(self, dev: Dev) -> Result<u32, CallError> {
        self.device_uint("nvmlDeviceGetMaxMigDeviceCount", sys::NvmlLib::nvmlDeviceGetMaxMigDeviceCount, dev)
    }

    /// The GPU instance id of a MIG device handle.
    pub(super) fn gi_id_of(self, mig: Dev) -> Result<u32, CallError> {
        self.device_uint("nvmlDeviceGetGpuInstanceId", sys::NvmlLib::nvmlDeviceGetGpuInstanceId, mig)
    }

    /// The compute instance id of a MIG device handle.
    pub(super) fn ci_id_of(self, mig: Dev) -> Result<u32, CallError> {
        self.device_uint("nvmlDeviceGetComputeInstanceId", sys::NvmlLib::nvmlDeviceGetComputeInstanceId, mig)
    }

    /// `(current, pending)` MIG mode (`nvmlDeviceGetMigMode`).
    pub(super) fn mig_mode(self, dev: Dev) -> Result<(u32, u32), CallError> {
        let (mut current, mut pending): (c_uint, c_uint) = (0, 0);
        // SAFETY: both out-parameters are locals.
        self.check("nvmlDeviceGetMigMode", unsafe { self.lib.nvmlDeviceGetMigMode(dev, &mut current, &mut pending) })?;
        Ok((current, pending))
    }

    /// `nvmlDeviceGetGpuInstanceProfileInfo`: `index` is an `NVML_GPU_INSTANCE_PROFILE_*` index,
    /// not a profile id.
    pub(super) fn gi_profile(self, dev: Dev, index: u32) -> Result<sys::nvmlGpuInstanceProfileInfo_t, CallError> {
        let mut info = sys::nvmlGpuInstanceProfileInfo_t::zeroed();
        // SAFETY: `info` is a local struct of the type the call fills.
        self.check("nvmlDeviceGetGpuInstanceProfileInfo", unsafe {
            self.lib.nvmlDeviceGetGpuInstanceProfileInfo(dev, index, &mut info)
        })?;
        Ok(info)
    }

    /// `(start, size)` of every placement of profile id `profile_id`. NVML: "placements ... can
    /// be NULL to discover number of allowed placements", so two calls.
    pub(super) fn placements(self, dev: Dev, profile_id: u32) -> Result<Vec<(u32, u32)>, CallError> {
        const CALL: &str = "nvmlDeviceGetGpuInstancePossiblePlacements_v2";
        let mut count: c_uint = 0;
        // SAFETY: a null buffer asks for the count only; `count` is a local.
        self.check(CALL, unsafe {
            self.lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(dev, profile_id, std::ptr::null_mut(), &mut count)
        })?;
        if count == 0 {
            return Ok(Vec::new());
        }
        let mut buf = vec![sys::nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
        // SAFETY: `buf` holds `count` placements, the number NVML just gave; `count` is a local.
        self.check(CALL, unsafe {
            self.lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2(dev, profile_id, buf.as_mut_ptr(), &mut count)
        })?;
        buf.truncate(count as usize);
        Ok(buf.iter().map(|p| (p.start, p.size)).collect())
    }

    /// The GPU instances of profile id `profile_id`; `capacity` is the profile's
    /// `instanceCount`, which NVML requires the buffer to hold (`nvmlDeviceGetGpuInstances`).
    pub(super) fn gpu_instances(self, dev: Dev, profile_id: u32, capacity: u32) -> Result<Vec<Gi>, CallError> {
        let mut buf: Vec<Gi> = vec![std::ptr::null_mut(); capacity.max(1) as usize];
        // An out-parameter per `nvml.h`; starting at the buffer's size is right either way.
        let mut count: c_uint = capacity.max(1);
        // SAFETY: `buf` holds `instanceCount` handles, as NVML requires; `count` is a local.
        self.check("nvmlDeviceGetGpuInstances", unsafe {
            self.lib.nvmlDeviceGetGpuInstances(dev, profile_id, buf.as_mut_ptr(), &mut count)
        })?;
        buf.truncate(count as usize);
        Ok(buf)
    }

    pub(super) fn gi_by_id(self, dev: Dev, id: u32) -> Result<Gi, CallError> {
        let mut gi = std::ptr::null_mut();
        // SAFETY: `gi` is a local the call writes.
        self.check("nvmlDeviceGetGpuInstanceById", unsafe { self.lib.nvmlDeviceGetGpuInstanceById(dev, id, &mut gi) })?;
        Ok(gi)
    }

    pub(super) fn create_gi(self, dev: Dev, profile_id: u32, start: u32, size: u32) -> Result<Gi, CallError> {
        let placement = sys::nvmlGpuInstancePlacement_t { start, size };
        let mut gi = std::ptr::null_mut();
        // SAFETY: `placement` and `gi` are locals; the call reads one and writes the other.
        self.check("nvmlDeviceCreateGpuInstanceWithPlacement", unsafe {
            self.lib.nvmlDeviceCreateGpuInstanceWithPlacement(dev, profile_id, &placement, &mut gi)
        })?;
        Ok(gi)
    }

    pub(super) fn gi_info(self, gi: Gi) -> Result<sys::nvmlGpuInstanceInfo_t, CallError> {
        let mut info = sys::nvmlGpuInstanceInfo_t::zeroed();
        // SAFETY: `info` is a local struct of the type the call fills.
        self.check("nvmlGpuInstanceGetInfo", unsafe { self.lib.nvmlGpuInstanceGetInfo(gi, &mut info) })?;
        Ok(info)
    }

    pub(super) fn destroy_gi(self, gi: Gi) -> Result<(), CallError> {
        // SAFETY: `gi` is a live handle; it is not used after this call succeeds.
        self.check("nvmlGpuInstanceDestroy", unsafe { self.lib.nvmlGpuInstanceDestroy(gi) })
    }

    /// `nvmlGpuInstanceGetComputeInstanceProfileInfo` for `NVML_COMPUTE_INSTANCE_PROFILE_*`
    /// index `index`, engines shared (the only engine profile NVML defines).
    pub(super) fn ci_profile(self, gi: Gi, index: u32) -> Result<sys::nvmlComputeInstanceProfileInfo_t, CallError> {
        let mut info = sys::nvmlComputeInstanceProfileInfo_t::zeroed();
        let shared = sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED;
        // SAFETY: `info` is a local struct of the type the call fills.
        self.check("nvmlGpuInstanceGetComputeInstanceProfileInfo", unsafe {
            self.lib.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, index, shared, &mut info)
        })?;
        Ok(info)
    }

    /// As [`Raw::gpu_instances`], for compute instances (`nvmlGpuInstanceGetComputeInstances`).
    pub(super) fn compute_instances(self, gi: Gi, profile_id: u32, capacity: u32) -> Result<Vec<Ci>, CallError> {
        let mut buf: Vec<Ci> = vec![std::ptr::null_mut(); capacity.max(1) as usize];
        let mut count: c_uint = capacity.max(1);
        // SAFETY: `buf` holds the profile's `instanceCount` handles; `count` is a local.
        self.check("nvmlGpuInstanceGetComputeInstances", unsafe {
            self.lib.nvmlGpuInstanceGetComputeInstances(gi, profile_id, buf.as_mut_ptr(), &mut count)
        })?;
        buf.truncate(count as usize);
        Ok(buf)
    }

    pub(super) fn ci_by_id(self, gi: Gi, id: u32) -> Result<Ci, CallError> {
        let mut ci = std::ptr::null_mut();
        // SAFETY: `ci` is a local the call writes.
        self.check("nvmlGpuInstanceGetComputeInstanceById", unsafe {
            self.lib.nvmlGpuInstanceGetComputeInstanceById(gi, id, &mut ci)
        })?;
        Ok(ci)
    }

    pub(super) fn create_ci(self, gi: Gi, profile_id: u32) -> Result<Ci, CallError> {
        let mut ci = std::ptr::null_mut();
        // SAFETY: `ci` is a local the call writes.
        self.check("nvmlGpuInstanceCreateComputeInstance", unsafe {
            self.lib.nvmlGpuInstanceCreateComputeInstance(gi, profile_id, &mut ci)
        })?;
        Ok(ci)
    }

    /// The compute instance's id (`nvmlComputeInstanceGetInfo`, which `nvml.h` maps to `_v2`).
    pub(super) fn ci_id(self, ci: Ci) -> Result<u32, CallError> {
        let mut info = sys::nvmlComputeInstanceInfo_t::zeroed();
        // SAFETY: `info` is a local struct of the type the call fills.
        self.check("nvmlComputeInstanceGetInfo_v2", unsafe { self.lib.nvmlComputeInstanceGetInfo_v2(ci, &mut info) })?;
        Ok(info.id)
    }

    pub(super) fn destroy_ci(self, ci: Ci) -> Result<(), CallError> {
        // SAFETY: `ci` is a live handle; it is not used after this call succeeds.
        self.check("nvmlComputeInstanceDestroy", unsafe { self.lib.nvmlComputeInstanceDestroy(ci) })
    }

    /// The MIG device at `index`, or `None` where there is none ("NVML_ERROR_NOT_FOUND if no
    /// valid MIG device was found at index", `nvmlDeviceGetMigDeviceHandleByIndex`).
    pub(super) fn mig_device(self, dev: Dev, index: u32) -> Result<Option<Dev>, CallError> {
        let mut mig = std::ptr::null_mut();
        // SAFETY: `mig` is a local the call writes.
        let code = unsafe { self.lib.nvmlDeviceGetMigDeviceHandleByIndex(dev, index, &mut mig) };
        if matches!(code, NOT_FOUND | INVALID_ARGUMENT) {
            Ok(None)
        } else {
            self.check("nvmlDeviceGetMigDeviceHandleByIndex", code).map(|()| Some(mig))
        }
    }
}

/// The text of a NUL-terminated buffer NVML filled.
pub(super) fn from_buffer(buf: &[u8]) -> Option<String> {
    CStr::from_bytes_until_nul(buf).ok()?.to_str().ok().map(str::to_owned)
}
