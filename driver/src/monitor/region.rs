//! HAMi-core's shared region (`shared_region_t`, structure version 1.2), read from bytes.
//!
//! The layout is HAMi-core's `src/multiprocess/multiprocess_memory_limit.h` (Project-HAMi/HAMi-core
//! at 02279de) for LP64 Linux with glibc (`sem_t` is 32 bytes, aligned to 8), the same that
//! HAMi's Go mirror `pkg/monitor/nvidia/v1/spec.go` reads:
//!
//! ```text
//! int32 initialized_flag; uint32 major_version, minor_version; int32 sm_init_flag;
//! size_t owner_pid; sem_t sem; uint64 device_num; char uuids[16][96];
//! uint64 limit[16], sm_limit[16]; shrreg_proc_slot_t procs[1024];
//! int proc_num, utilization_switch, recent_kernel, priority; uint64 last_kernel_time;
//! sem_t sem_postinit;
//! shrreg_proc_slot_t: int32 pid, hostpid; device_memory_t used[16] (context_size,
//!   module_size, data_size, offset, total, unused[3]); uint64 monitorused[16];
//!   device_util_t device_util[16] (dec_util, enc_util, sm_util, unused[3]); int32 status;
//!   uint64 seqlock, unused[2];
//! ```
//!
//! The file is written by the tenant's processes, so nothing here trusts it: the reader takes
//! bytes it read itself (never a mapping), checks the flag, the version and every count before
//! using one, and sums with saturation.

/// `MULTIPROCESS_SHARED_REGION_MAGIC_FLAG`: set once HAMi-core initialised the region.
pub const MAGIC_FLAG: i32 = 19_920_718;
/// The structure's major version this layout describes.
pub const MAJOR_VERSION: u32 = 1;
/// The lowest minor version with this layout (1.2 added `last_kernel_time` and the slots'
/// `seqlock` in place of padding); a later minor version may only append.
pub const MIN_MINOR_VERSION: u32 = 2;
/// `CUDA_DEVICE_MAX_COUNT`.
pub const MAX_DEVICES: usize = 16;
/// `SHARED_REGION_MAX_PROCESS_NUM`.
pub const MAX_PROCS: usize = 1024;

/// Byte offsets of the fields this driver reads or writes, and the sizes that place them.
pub mod offset {
    /// `initialized_flag` (int32).
    pub const INITIALIZED_FLAG: usize = 0;
    /// `major_version` (uint32).
    pub const MAJOR_VERSION: usize = 4;
    /// `minor_version` (uint32).
    pub const MINOR_VERSION: usize = 8;
    /// `device_num` (uint64), after `sm_init_flag`, `owner_pid` and the 32-byte `sem`.
    pub const DEVICE_NUM: usize = 56;
    /// `uuids[16][96]`.
    pub const UUIDS: usize = 64;
    /// Length of one uuid buffer.
    pub const UUID_LEN: usize = 96;
    /// `limit[16]` (uint64 bytes).
    pub const LIMIT: usize = 1600;
    /// `sm_limit[16]` (uint64 percent).
    pub const SM_LIMIT: usize = 1728;
    /// `procs[1024]`.
    pub const PROCS: usize = 1856;
    /// `sizeof(shrreg_proc_slot_t)`.
    pub const SLOT_SIZE: usize = 1960;
    /// `pid` within a slot (int32).
    pub const SLOT_PID: usize = 0;
    /// `used[16]` within a slot; each `device_memory_t` is 64 bytes.
    pub const SLOT_USED: usize = 8;
    /// `sizeof(device_memory_t)`.
    pub const MEMORY_SIZE: usize = 64;
    /// `context_size`, `module_size`, `data_size`, `total` within a `device_memory_t`.
    pub const MEMORY_CONTEXT: usize = 0;
    /// See [`MEMORY_CONTEXT`].
    pub const MEMORY_MODULE: usize = 8;
    /// See [`MEMORY_CONTEXT`].
    pub const MEMORY_DATA: usize = 16;
    /// See [`MEMORY_CONTEXT`].
    pub const MEMORY_TOTAL: usize = 32;
    /// `device_util[16]` within a slot; each `device_util_t` is 48 bytes.
    pub const SLOT_UTIL: usize = 1160;
    /// `sizeof(device_util_t)`.
    pub const UTIL_SIZE: usize = 48;
    /// `sm_util` within a `device_util_t`.
    pub const UTIL_SM: usize = 16;
    /// `proc_num` (int).
    pub const PROC_NUM: usize = PROCS + crate::monitor::region::MAX_PROCS * SLOT_SIZE;
    /// `utilization_switch` (int): 1 throttles to the SM limit, 0 lets the container burst.
    pub const UTILIZATION_SWITCH: usize = PROC_NUM + 4;
    /// `recent_kernel` (int): HAMi-core sets 2 at each launch; negative makes launches wait.
    pub const RECENT_KERNEL: usize = PROC_NUM + 8;
    /// `priority` (int), from `CUDA_TASK_PRIORITY`; never trusted, see the monitor.
    pub const PRIORITY: usize = PROC_NUM + 12;
    /// `last_kernel_time` (uint64, seconds since the epoch).
    pub const LAST_KERNEL_TIME: usize = PROC_NUM + 16;
    /// The tail read in one go: from `proc_num` to the end of `last_kernel_time`.
    pub const TAIL_LEN: usize = 24;
    /// `sizeof(shared_region_t)`, with the trailing `sem_postinit`.
    pub const REGION_SIZE: usize = LAST_KERNEL_TIME + 8 + 32;
    /// The header read in one go: everything before `procs`.
    pub const HEAD_LEN: usize = PROCS;
}

/// What one card's index holds, summed over the region's processes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceUsage {
    /// Σ `used[i].total`: the bytes HAMi-core counts against the limit.
    pub total: u64,
    /// Σ `used[i].context_size`.
    pub context: u64,
    /// Σ `used[i].module_size`.
    pub module: u64,
    /// Σ `used[i].data_size`.
    pub data: u64,
    /// Σ `device_util[i].sm_util`, percent of the card.
    pub sm_util: u64,
}

/// The fields of a region this driver uses, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    /// `minor_version`.
    pub minor_version: u32,
    /// `device_num`.
    pub device_num: usize,
    /// `limit[i]` for `i < device_num`, as HAMi-core set it.
    pub limits: Vec<u64>,
    /// Usage per device index `i < device_num`.
    pub usage: Vec<DeviceUsage>,
    /// `proc_num`.
    pub proc_num: usize,
    /// `utilization_switch`.
    pub utilization_switch: i32,
    /// `recent_kernel`.
    pub recent_kernel: i32,
    /// `last_kernel_time`.
    pub last_kernel_time: u64,
}

/// Why bytes are not a usable region.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegionError {
    /// Not initialised yet (a process is starting) — not the tenant's fault.
    #[error("not initialised (flag {0})")]
    Uninitialised(i32),
    /// Another structure version.
    #[error("structure version {major}.{minor}; this driver reads {MAJOR_VERSION}.{MIN_MINOR_VERSION} and later minors")]
    Version {
        /// `major_version`.
        major: u32,
        /// `minor_version`.
        minor: u32,
    },
    /// A count out of its range.
    #[error("{field} = {value} is out of range (at most {max})")]
    Count {
        /// The field.
        field: &'static str,
        /// Its value.
        value: i64,
        /// The largest valid value.
        max: usize,
    },
    /// Fewer bytes than the layout needs.
    #[error("{0} bytes where the layout needs {1}")]
    Short(usize, usize),
}

impl RegionError {
    /// A short reason for the metric's label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Uninitialised(_) => "uninitialised",
            Self::Version { .. } => "version",
            Self::Count { .. } => "count",
            Self::Short(..) => "truncated",
        }
    }
}

fn i32_at(b: &[u8], at: usize) -> i32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&b[at..at + 4]);
    i32::from_ne_bytes(word)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&b[at..at + 4]);
    u32::from_ne_bytes(word)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(word)
}

/// The checked header: flag, version and device count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    minor_version: u32,
    device_num: usize,
    limits: Vec<u64>,
}

/// The checked tail: process count and the feedback fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tail {
    /// `proc_num`.
    pub proc_num: usize,
    /// `utilization_switch`.
    pub utilization_switch: i32,
    /// `recent_kernel`.
    pub recent_kernel: i32,
    /// `last_kernel_time`.
    pub last_kernel_time: u64,
}

/// Parses the first [`offset::HEAD_LEN`] bytes.
///
/// # Errors
/// [`RegionError`] for a short buffer, a missing flag, another version or too many devices.
pub fn parse_head(head: &[u8]) -> Result<Header, RegionError> {
    if head.len() < offset::HEAD_LEN {
        return Err(RegionError::Short(head.len(), offset::HEAD_LEN));
    }
    let flag = i32_at(head, offset::INITIALIZED_FLAG);
    if flag != MAGIC_FLAG {
        return Err(RegionError::Uninitialised(flag));
    }
    let (major, minor) = (u32_at(head, offset::MAJOR_VERSION), u32_at(head, offset::MINOR_VERSION));
    if major != MAJOR_VERSION || minor < MIN_MINOR_VERSION {
        return Err(RegionError::Version { major, minor });
    }
    let device_num = u64_at(head, offset::DEVICE_NUM);
    let device_num = usize::try_from(device_num).ok().filter(|n| *n <= MAX_DEVICES).ok_or(RegionError::Count {
        field: "device_num",
        value: device_num.try_into().unwrap_or(i64::MAX),
        max: MAX_DEVICES,
    })?;
    let limits = (0..device_num).map(|i| u64_at(head, offset::LIMIT + 8 * i)).collect();
    Ok(Header { minor_version: minor, device_num, limits })
}

/// Parses the [`offset::TAIL_LEN`] bytes at [`offset::PROC_NUM`].
///
/// # Errors
/// [`RegionError`] for a short buffer or a process count out of range.
pub fn parse_tail(tail: &[u8]) -> Result<Tail, RegionError> {
    if tail.len() < offset::TAIL_LEN {
        return Err(RegionError::Short(tail.len(), offset::TAIL_LEN));
    }
    let proc_num = i32_at(tail, 0);
    let proc_num = usize::try_from(proc_num).ok().filter(|n| *n <= MAX_PROCS).ok_or(RegionError::Count {
        field: "proc_num",
        value: i64::from(proc_num),
        max: MAX_PROCS,
    })?;
    Ok(Tail {
        proc_num,
        utilization_switch: i32_at(tail, offset::UTILIZATION_SWITCH - offset::PROC_NUM),
        recent_kernel: i32_at(tail, offset::RECENT_KERNEL - offset::PROC_NUM),
        last_kernel_time: u64_at(tail, offset::LAST_KERNEL_TIME - offset::PROC_NUM),
    })
}

/// Adds one process slot's usage of the first `devices` indexes to `usage`.
///
/// # Errors
/// [`RegionError::Short`] for a buffer shorter than a slot.
pub fn add_slot(slot: &[u8], usage: &mut [DeviceUsage]) -> Result<(), RegionError> {
    if slot.len() < offset::SLOT_SIZE {
        return Err(RegionError::Short(slot.len(), offset::SLOT_SIZE));
    }
    // HAMi-core marks a slot of an exited process with pid 0 before it is compacted away.
    if i32_at(slot, offset::SLOT_PID) == 0 {
        return Ok(());
    }
    for (i, u) in usage.iter_mut().enumerate() {
        let memory = offset::SLOT_USED + i * offset::MEMORY_SIZE;
        u.total = u.total.saturating_add(u64_at(slot, memory + offset::MEMORY_TOTAL));
        u.context = u.context.saturating_add(u64_at(slot, memory + offset::MEMORY_CONTEXT));
        u.module = u.module.saturating_add(u64_at(slot, memory + offset::MEMORY_MODULE));
        u.data = u.data.saturating_add(u64_at(slot, memory + offset::MEMORY_DATA));
        let util = offset::SLOT_UTIL + i * offset::UTIL_SIZE + offset::UTIL_SM;
        u.sm_util = u.sm_util.saturating_add(u64_at(slot, util));
    }
    Ok(())
}

/// Parses a whole region held in memory (tests, and the benchmark's writer).
///
/// # Errors
/// [`RegionError`] as the parts do.
pub fn parse(bytes: &[u8]) -> Result<Region, RegionError> {
    if bytes.len() < offset::PROC_NUM + offset::TAIL_LEN {
        return Err(RegionError::Short(bytes.len(), offset::PROC_NUM + offset::TAIL_LEN));
    }
    let head = parse_head(&bytes[..offset::HEAD_LEN])?;
    let tail = parse_tail(&bytes[offset::PROC_NUM..offset::PROC_NUM + offset::TAIL_LEN])?;
    let mut usage = vec![DeviceUsage::default(); head.device_num];
    for p in 0..tail.proc_num {
        let at = offset::PROCS + p * offset::SLOT_SIZE;
        add_slot(&bytes[at..at + offset::SLOT_SIZE], &mut usage)?;
    }
    Ok(assemble(head, tail, usage))
}

/// The region from its checked parts.
pub fn assemble(head: Header, tail: Tail, usage: Vec<DeviceUsage>) -> Region {
    Region {
        minor_version: head.minor_version,
        device_num: head.device_num,
        limits: head.limits,
        usage,
        proc_num: tail.proc_num,
        utilization_switch: tail.utilization_switch,
        recent_kernel: tail.recent_kernel,
        last_kernel_time: tail.last_kernel_time,
    }
}

impl Header {
    /// `device_num`.
    pub fn device_num(&self) -> usize {
        self.device_num
    }
}

/// Writes regions as HAMi-core lays them out: the tests' and the benchmark's stand-in for a
/// container's processes.
pub mod writer {
    use crate::monitor::region::{MAGIC_FLAG, MAJOR_VERSION, MIN_MINOR_VERSION, offset};

    /// One process of a region.
    #[derive(Debug, Clone, Copy, Default)]
    pub struct Process {
        /// Its pid (0: a slot of an exited process).
        pub pid: i32,
        /// Bytes in use on device 0 (`used[0].total`; the data part holds the same).
        pub memory: u64,
        /// SM utilisation on device 0, percent.
        pub sm_util: u64,
    }

    /// A region as HAMi-core initialises it for `uuids`, with `limits` and `processes`.
    pub fn region(uuids: &[&str], limits: &[u64], processes: &[Process]) -> Vec<u8> {
        let mut b = vec![0u8; offset::REGION_SIZE];
        put_i32(&mut b, offset::INITIALIZED_FLAG, MAGIC_FLAG);
        put_u32(&mut b, offset::MAJOR_VERSION, MAJOR_VERSION);
        put_u32(&mut b, offset::MINOR_VERSION, MIN_MINOR_VERSION);
        put_u64(&mut b, offset::DEVICE_NUM, uuids.len() as u64);
        for (i, uuid) in uuids.iter().enumerate() {
            let at = offset::UUIDS + i * offset::UUID_LEN;
            let n = uuid.len().min(offset::UUID_LEN - 1);
            b[at..at + n].copy_from_slice(&uuid.as_bytes()[..n]);
        }
        for (i, limit) in limits.iter().enumerate() {
            put_u64(&mut b, offset::LIMIT + 8 * i, *limit);
        }
        for (p, process) in processes.iter().enumerate() {
            let slot = offset::PROCS + p * offset::SLOT_SIZE;
            put_i32(&mut b, slot + offset::SLOT_PID, process.pid);
            put_u64(&mut b, slot + offset::SLOT_USED + offset::MEMORY_TOTAL, process.memory);
            put_u64(&mut b, slot + offset::SLOT_USED + offset::MEMORY_DATA, process.memory);
            put_u64(&mut b, slot + offset::SLOT_UTIL + offset::UTIL_SM, process.sm_util);
        }
        put_i32(&mut b, offset::PROC_NUM, i32::try_from(processes.len()).unwrap_or(i32::MAX));
        put_i32(&mut b, offset::UTILIZATION_SWITCH, 1);
        put_i32(&mut b, offset::RECENT_KERNEL, 2);
        put_i32(&mut b, offset::PRIORITY, 1);
        b
    }

    /// Stores an int32 at `at`.
    pub fn put_i32(b: &mut [u8], at: usize, v: i32) {
        b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    }

    fn put_u32(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    }

    /// Stores a uint64 at `at`.
    pub fn put_u64(b: &mut [u8], at: usize, v: u64) {
        b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::writer::{Process, put_i32, put_u64, region};
    use super::*;

    /// `shared_region_t` transcribed field by field from HAMi-core's header, so the compiler
    /// lays it out as the C compiler does; the constants must agree with it.
    #[allow(dead_code)]
    #[repr(C)]
    struct DeviceMemoryT {
        context_size: u64,
        module_size: u64,
        data_size: u64,
        offset: u64,
        total: u64,
        unused: [u64; 3],
    }
    #[allow(dead_code)]
    #[repr(C)]
    struct DeviceUtilT {
        dec_util: u64,
        enc_util: u64,
        sm_util: u64,
        unused: [u64; 3],
    }
    #[allow(dead_code)]
    #[repr(C)]
    struct ShrregProcSlotT {
        pid: i32,
        hostpid: i32,
        used: [DeviceMemoryT; 16],
        monitorused: [u64; 16],
        device_util: [DeviceUtilT; 16],
        status: i32,
        seqlock: u64,
        unused: [u64; 2],
    }
    /// glibc's `sem_t` on LP64: a 32-byte union aligned as a long.
    #[allow(dead_code)]
    #[repr(C)]
    struct SemT([u64; 4]);
    #[allow(dead_code)]
    #[repr(C)]
    struct SharedRegionT {
        initialized_flag: i32,
        major_version: u32,
        minor_version: u32,
        sm_init_flag: i32,
        owner_pid: usize,
        sem: SemT,
        device_num: u64,
        uuids: [[u8; 96]; 16],
        limit: [u64; 16],
        sm_limit: [u64; 16],
        procs: [ShrregProcSlotT; 1024],
        proc_num: i32,
        utilization_switch: i32,
        recent_kernel: i32,
        priority: i32,
        last_kernel_time: u64,
        sem_postinit: SemT,
    }

    #[test]
    fn the_offsets_are_those_of_hami_cores_header() {
        use std::mem::{offset_of, size_of};
        assert_eq!(size_of::<SharedRegionT>(), offset::REGION_SIZE);
        assert_eq!(size_of::<ShrregProcSlotT>(), offset::SLOT_SIZE);
        assert_eq!(size_of::<DeviceMemoryT>(), offset::MEMORY_SIZE);
        assert_eq!(size_of::<DeviceUtilT>(), offset::UTIL_SIZE);
        assert_eq!(offset_of!(SharedRegionT, initialized_flag), offset::INITIALIZED_FLAG);
        assert_eq!(offset_of!(SharedRegionT, major_version), offset::MAJOR_VERSION);
        assert_eq!(offset_of!(SharedRegionT, minor_version), offset::MINOR_VERSION);
        assert_eq!(offset_of!(SharedRegionT, device_num), offset::DEVICE_NUM);
        assert_eq!(offset_of!(SharedRegionT, uuids), offset::UUIDS);
        assert_eq!(offset_of!(SharedRegionT, limit), offset::LIMIT);
        assert_eq!(offset_of!(SharedRegionT, sm_limit), offset::SM_LIMIT);
        assert_eq!(offset_of!(SharedRegionT, procs), offset::PROCS);
        assert_eq!(offset_of!(SharedRegionT, proc_num), offset::PROC_NUM);
        assert_eq!(offset_of!(SharedRegionT, utilization_switch), offset::UTILIZATION_SWITCH);
        assert_eq!(offset_of!(SharedRegionT, recent_kernel), offset::RECENT_KERNEL);
        assert_eq!(offset_of!(SharedRegionT, priority), offset::PRIORITY);
        assert_eq!(offset_of!(SharedRegionT, last_kernel_time), offset::LAST_KERNEL_TIME);
        assert_eq!(offset_of!(ShrregProcSlotT, pid), offset::SLOT_PID);
        assert_eq!(offset_of!(ShrregProcSlotT, used), offset::SLOT_USED);
        assert_eq!(offset_of!(ShrregProcSlotT, device_util), offset::SLOT_UTIL);
        assert_eq!(offset_of!(DeviceMemoryT, total), offset::MEMORY_TOTAL);
        assert_eq!(offset_of!(DeviceMemoryT, context_size), offset::MEMORY_CONTEXT);
        assert_eq!(offset_of!(DeviceMemoryT, module_size), offset::MEMORY_MODULE);
        assert_eq!(offset_of!(DeviceMemoryT, data_size), offset::MEMORY_DATA);
        assert_eq!(offset_of!(DeviceUtilT, sm_util), offset::UTIL_SM);
    }

    #[test]
    fn a_region_reads_back_what_its_processes_wrote() {
        let procs = [
            Process { pid: 10, memory: 3 << 30, sm_util: 20 },
            Process { pid: 0, memory: 1 << 40, sm_util: 99 },
            Process { pid: 11, memory: 1 << 30, sm_util: 15 },
        ];
        let r = parse(&region(&["GPU-a"], &[4 << 30], &procs)).unwrap();
        assert_eq!(r.device_num, 1);
        assert_eq!(r.limits, vec![4 << 30]);
        assert_eq!(r.proc_num, 3);
        // The exited process's slot (pid 0) counts for nothing.
        assert_eq!(r.usage[0].total, 4 << 30);
        assert_eq!(r.usage[0].sm_util, 35);
        assert_eq!((r.utilization_switch, r.recent_kernel), (1, 2));
    }

    #[test]
    fn a_region_that_lies_about_its_counts_is_refused_by_name() {
        let mut b = region(&["GPU-a"], &[1], &[]);
        put_u64(&mut b, offset::DEVICE_NUM, 17);
        assert!(matches!(parse(&b), Err(RegionError::Count { field: "device_num", .. })));
        let mut b = region(&["GPU-a"], &[1], &[]);
        put_i32(&mut b, offset::PROC_NUM, 1025);
        assert!(matches!(parse(&b), Err(RegionError::Count { field: "proc_num", .. })));
        put_i32(&mut b, offset::PROC_NUM, -1);
        assert!(matches!(parse(&b), Err(RegionError::Count { field: "proc_num", .. })));
        let mut b = region(&["GPU-a"], &[1], &[]);
        put_i32(&mut b, offset::MAJOR_VERSION, 2);
        assert!(matches!(parse(&b), Err(RegionError::Version { major: 2, .. })));
        let mut b = region(&["GPU-a"], &[1], &[]);
        put_i32(&mut b, offset::INITIALIZED_FLAG, 0);
        assert_eq!(parse(&b), Err(RegionError::Uninitialised(0)));
        assert!(matches!(parse(&b[..100]), Err(RegionError::Short(100, _))));
    }

    #[test]
    fn sums_saturate_instead_of_wrapping() {
        let procs = [Process { pid: 1, memory: u64::MAX, sm_util: u64::MAX }, Process { pid: 2, memory: 5, sm_util: 5 }];
        let r = parse(&region(&["GPU-a"], &[1], &procs)).unwrap();
        assert_eq!((r.usage[0].total, r.usage[0].sm_util), (u64::MAX, u64::MAX));
    }

    #[test]
    fn any_bytes_parse_or_fail_without_panicking() {
        // A tenant may write anything into any field; only the checks above may stop a parse.
        let mut rng = fastrand::Rng::with_seed(7);
        let base = region(&["GPU-a", "GPU-b"], &[1, 2], &[Process { pid: 1, memory: 1, sm_util: 1 }]);
        for _ in 0..200 {
            let mut b = base.clone();
            for _ in 0..64 {
                let at = rng.usize(..offset::HEAD_LEN.max(1));
                b[at] = rng.u8(..);
                let at = offset::PROC_NUM + rng.usize(..offset::TAIL_LEN);
                b[at] = rng.u8(..);
            }
            let _ = parse(&b);
        }
    }
}
