//! HAMi-core limits from consumed capacity: what `libvgpu.so` reads from the container's
//! environment. Devices are numbered in the order given (the claim's device order), which is the
//! CUDA device order inside the container.

use crate::Quantity;

/// HAMi-core handles at most this many devices per container.
pub const MAX_DEVICES: usize = 16;

const MIB: i128 = 1 << 20;

/// One device share as the container sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceShare {
    /// Card (or MIG) UUID.
    pub uuid: String,
    /// Consumed memory in bytes.
    pub memory: Quantity,
    /// Consumed cores in percent of the card.
    pub cores: Quantity,
}

/// Options that add HAMi-core knobs to the environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LimitOptions {
    /// Memory is over-subscribed (deviceMemoryScaling > 1): HAMi sets `CUDA_OVERSUBSCRIBE=true`.
    pub oversubscribed: bool,
    /// `LIBCUDA_LOG_LEVEL` (0-4).
    pub log_level: Option<u8>,
    /// `GPU_CORE_UTILIZATION_POLICY` (default, force, disable).
    pub core_policy: Option<String>,
}

/// Limits that cannot be expressed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// More devices than HAMi-core handles.
    #[error("{0} devices in one container; HAMi-core handles at most {MAX_DEVICES}")]
    TooManyDevices(usize),
    /// No device at all.
    #[error("no devices to limit")]
    NoDevices,
    /// A share of no memory: `CUDA_DEVICE_MEMORY_LIMIT_<i>=0m` means "unlimited" to HAMi-core.
    #[error("the share of {0} has no memory; HAMi-core would read a zero limit as unlimited")]
    NoMemory(String),
}

/// The shares as the container sees them: one entry per card, in order of first appearance,
/// with the amounts of every share on that card summed. Two requests of one claim placed on the
/// same card are one CUDA device inside the container, so they get one limit holding both
/// (never `_0` and `_1` for one card). Cores are capped at a whole card.
pub fn per_card(shares: &[DeviceShare]) -> Vec<DeviceShare> {
    let mut cards: Vec<DeviceShare> = Vec::new();
    for share in shares {
        match cards.iter_mut().find(|c| c.uuid == share.uuid) {
            Some(card) => {
                card.memory = card.memory.checked_add(share.memory).unwrap_or(card.memory);
                let cores = card.cores.checked_add(share.cores).unwrap_or(card.cores);
                card.cores = cores.min(Quantity::from_int(100, crate::Format::DecimalSI));
            }
            None => cards.push(share.clone()),
        }
    }
    cards
}

/// `CUDA_DEVICE_MEMORY_LIMIT_<i>` value: whole MiB rounded down, with HAMi's `m` suffix, never
/// `0m` for a non-zero share (0 would mean unlimited).
pub fn memory_limit(bytes: Quantity) -> String {
    let nanos_per_mib = MIB * 1_000_000_000;
    let mib = bytes.nanos().div_euclid(nanos_per_mib);
    let mib = if mib == 0 && bytes.nanos() > 0 { 1 } else { mib.max(0) };
    format!("{mib}m")
}

/// `CUDA_DEVICE_SM_LIMIT` value: the whole percent the share consumed, rounded down and at most
/// 100 (0 and 100 mean no throttling to HAMi-core). A share below one percent is the minimal
/// charge of a request for 0 cores ([`crate::device::MIN_CORES`]): HAMi's "no limit", so 0.
pub fn sm_limit(cores: Quantity) -> String {
    let whole = cores.nanos().div_euclid(1_000_000_000).clamp(0, 100);
    whole.to_string()
}

/// The environment for a container holding `shares` (in CUDA order), with the shared cache file
/// in `cache_dir`. Shares on the same card are merged first ([`per_card`]), so every index is
/// one distinct card.
///
/// # Errors
/// [`LimitError`] for no devices, more than HAMi-core handles, or a zero memory share (which
/// HAMi-core would read as "no limit").
pub fn container_env(
    shares: &[DeviceShare],
    cache_dir: &str,
    options: &LimitOptions,
) -> Result<Vec<(String, String)>, LimitError> {
    let shares = &per_card(shares);
    if let Some(share) = shares.iter().find(|s| s.memory.nanos() <= 0) {
        return Err(LimitError::NoMemory(share.uuid.clone()));
    }
    if shares.is_empty() {
        return Err(LimitError::NoDevices);
    }
    if shares.len() > MAX_DEVICES {
        return Err(LimitError::TooManyDevices(shares.len()));
    }
    let mut env = Vec::new();
    for (i, share) in shares.iter().enumerate() {
        env.push((format!("CUDA_DEVICE_MEMORY_LIMIT_{i}"), memory_limit(share.memory)));
        env.push((format!("CUDA_DEVICE_SM_LIMIT_{i}"), sm_limit(share.cores)));
    }
    let first = sm_limit(shares[0].cores);
    if shares.iter().all(|s| sm_limit(s.cores) == first) {
        env.push(("CUDA_DEVICE_SM_LIMIT".into(), first));
    }
    // One region per container, shared by its processes; named after the first card.
    env.push(("CUDA_DEVICE_MEMORY_SHARED_CACHE".into(), format!("{}/{}.cache", cache_dir.trim_end_matches('/'), shares[0].uuid)));
    env.push(("NVIDIA_VISIBLE_DEVICES".into(), shares.iter().map(|s| s.uuid.as_str()).collect::<Vec<_>>().join(",")));
    if options.oversubscribed {
        env.push(("CUDA_OVERSUBSCRIBE".into(), "true".into()));
    }
    if let Some(level) = options.log_level {
        env.push(("LIBCUDA_LOG_LEVEL".into(), level.to_string()));
    }
    if let Some(policy) = &options.core_policy {
        env.push(("GPU_CORE_UTILIZATION_POLICY".into(), policy.clone()));
    }
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    fn share(uuid: &str, memory: &str, cores: &str) -> DeviceShare {
        DeviceShare { uuid: uuid.into(), memory: q(memory), cores: q(cores) }
    }

    fn get<'a>(env: &'a [(String, String)], key: &str) -> Option<&'a str> {
        env.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    #[test]
    fn memory_limits_are_whole_mib_and_never_zero() {
        assert_eq!(memory_limit(q("4Gi")), "4096m");
        assert_eq!(memory_limit(q("954Mi")), "954m");
        assert_eq!(memory_limit(q("1.5Mi")), "1m");
        assert_eq!(memory_limit(q("1")), "1m");
        assert_eq!(memory_limit(q("143771Mi")), "143771m");
        assert_eq!(memory_limit(Quantity::ZERO), "0m");
    }

    #[test]
    fn sm_limits_are_the_whole_percent_consumed_and_the_minimal_charge_is_no_limit() {
        assert_eq!(sm_limit(q("50")), "50");
        assert_eq!(sm_limit(q("0")), "0");
        assert_eq!(sm_limit(q("100")), "100");
        // What a cores-0 request consumes is HAMi's "no limit", not 1 %.
        assert_eq!(sm_limit(crate::device::MIN_CORES), "0");
        assert_eq!(sm_limit(q("999m")), "0");
        assert_eq!(sm_limit(q("30500m")), "30", "never more than was consumed");
        // A card with scaled cores (deviceCoreScaling 2) taken whole is still one card's SMs.
        assert_eq!(sm_limit(q("200")), "100");
    }

    #[test]
    fn env_is_indexed_in_claim_order_with_unindexed_sm_when_all_agree() {
        let env = container_env(
            &[share("GPU-b", "4Gi", "50"), share("GPU-a", "8Gi", "50")],
            "/usr/local/vgpu/claims/u1",
            &LimitOptions::default(),
        )
        .unwrap();
        assert_eq!(get(&env, "CUDA_DEVICE_MEMORY_LIMIT_0"), Some("4096m"));
        assert_eq!(get(&env, "CUDA_DEVICE_MEMORY_LIMIT_1"), Some("8192m"));
        assert_eq!(get(&env, "CUDA_DEVICE_SM_LIMIT"), Some("50"));
        assert_eq!(get(&env, "NVIDIA_VISIBLE_DEVICES"), Some("GPU-b,GPU-a"));
        assert_eq!(get(&env, "CUDA_DEVICE_MEMORY_SHARED_CACHE"), Some("/usr/local/vgpu/claims/u1/GPU-b.cache"));
        assert_eq!(get(&env, "CUDA_OVERSUBSCRIBE"), None);

        let mixed = container_env(
            &[share("GPU-a", "1Gi", "30"), share("GPU-b", "1Gi", "60")],
            "/c",
            &LimitOptions { oversubscribed: true, log_level: Some(2), core_policy: Some("force".into()) },
        )
        .unwrap();
        assert_eq!(get(&mixed, "CUDA_DEVICE_SM_LIMIT"), None);
        assert_eq!(get(&mixed, "CUDA_DEVICE_SM_LIMIT_1"), Some("60"));
        assert_eq!(get(&mixed, "CUDA_OVERSUBSCRIBE"), Some("true"));
        assert_eq!(get(&mixed, "LIBCUDA_LOG_LEVEL"), Some("2"));
        assert_eq!(get(&mixed, "GPU_CORE_UTILIZATION_POLICY"), Some("force"));
    }

    #[test]
    fn shares_on_one_card_are_one_device_with_the_sum() {
        let env = container_env(
            &[share("GPU-a", "4Gi", "30"), share("GPU-b", "2Gi", "10"), share("GPU-a", "8Gi", "90")],
            "/c",
            &LimitOptions::default(),
        )
        .unwrap();
        assert_eq!(get(&env, "NVIDIA_VISIBLE_DEVICES"), Some("GPU-a,GPU-b"));
        assert_eq!(get(&env, "CUDA_DEVICE_MEMORY_LIMIT_0"), Some("12288m"));
        assert_eq!(get(&env, "CUDA_DEVICE_SM_LIMIT_0"), Some("100"), "capped at a whole card");
        assert_eq!(get(&env, "CUDA_DEVICE_MEMORY_LIMIT_1"), Some("2048m"));
        assert_eq!(get(&env, "CUDA_DEVICE_MEMORY_LIMIT_2"), None);
    }

    #[test]
    fn a_share_without_memory_is_never_unlimited() {
        for memory in ["0", "-1Mi"] {
            let err = container_env(&[share("GPU-a", memory, "10")], "/c", &LimitOptions::default()).unwrap_err();
            assert_eq!(err, LimitError::NoMemory("GPU-a".into()));
        }
    }

    #[test]
    fn device_count_is_bounded() {
        let many: Vec<_> = (0..17).map(|i| share(&format!("GPU-{i}"), "1Gi", "1")).collect();
        assert_eq!(container_env(&many, "/c", &LimitOptions::default()).unwrap_err(), LimitError::TooManyDevices(17));
        assert_eq!(container_env(&[], "/c", &LimitOptions::default()).unwrap_err(), LimitError::NoDevices);
    }
}
