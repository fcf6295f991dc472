//! How a node shares its cards: driver name, split count, over-subscription and device filters.

use crate::{DriverName, Format, Quantity};

/// The driver name HAMi DRA uses, kept so HAMi's DeviceClass and workloads work unchanged.
pub const DEFAULT_DRIVER_NAME: &str = "hami-core-gpu.project-hami.io";

/// An exact positive ratio such as `1.5`, for scaling capacities without floats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ratio(Quantity);

/// A bad configuration value; the message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct ConfigError {
    /// The configuration key.
    pub key: &'static str,
    /// What is wrong with its value.
    pub reason: String,
}

impl Ratio {
    /// One: no scaling.
    pub const ONE: Self = Self(Quantity::from_int(1, Format::DecimalSI));

    /// Parses a ratio of at least 1 (HAMi's scaling factors over-subscribe, never shrink).
    ///
    /// # Errors
    /// [`ConfigError`] for `key` when the text is not a number or below 1.
    pub fn parse(key: &'static str, text: &str) -> Result<Self, ConfigError> {
        let q = Quantity::parse(text).map_err(|e| ConfigError { key, reason: e.to_string() })?;
        if q < Quantity::from_int(1, Format::DecimalSI) {
            return Err(ConfigError { key, reason: format!("{text} is below 1; scaling can only over-subscribe") });
        }
        Ok(Self(q))
    }

    /// Whether the ratio is exactly one.
    pub fn is_one(&self) -> bool {
        *self == Self::ONE
    }

    /// `value * ratio`, rounded down to a multiple of `grain`.
    pub fn apply(&self, value: Quantity, grain: Quantity) -> Quantity {
        value.scale_floor(self.0.nanos(), 1_000_000_000, grain).unwrap_or(value)
    }
}

impl std::fmt::Display for Ratio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Devices to leave out of the pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceFilter {
    /// UUIDs of cards to leave out.
    pub uuids: Vec<String>,
    /// NVML indices of cards to leave out.
    pub indices: Vec<u32>,
}

/// The sharing configuration that applies to one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharingConfig {
    /// The DRA driver name (also the attribute domain).
    pub driver_name: DriverName,
    /// How many shares a card can hold at once (HAMi `deviceSplitCount`).
    pub device_split_count: u32,
    /// Memory over-subscription factor (HAMi `deviceMemoryScaling`).
    pub memory_scaling: Ratio,
    /// Compute over-subscription factor (HAMi `deviceCoreScaling`).
    pub core_scaling: Ratio,
    /// Cards to leave out.
    pub filter: DeviceFilter,
}

impl Default for SharingConfig {
    fn default() -> Self {
        Self {
            driver_name: DriverName::new(DEFAULT_DRIVER_NAME).unwrap_or_else(|_| unreachable!("constant is valid")),
            device_split_count: 10,
            memory_scaling: Ratio::ONE,
            core_scaling: Ratio::ONE,
            filter: DeviceFilter::default(),
        }
    }
}

impl SharingConfig {
    /// Checks values that types alone cannot.
    ///
    /// # Errors
    /// [`ConfigError`] naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.device_split_count == 0 {
            return Err(ConfigError { key: "deviceSplitCount", reason: "must be at least 1".into() });
        }
        Ok(())
    }
}

/// Settings that replace the cluster-wide ones on some nodes (HAMi's per-node device config).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeOverride {
    /// The nodes this override applies to, by name.
    pub nodes: Vec<String>,
    /// Replaces `deviceSplitCount`.
    pub device_split_count: Option<u32>,
    /// Replaces `deviceMemoryScaling`.
    pub memory_scaling: Option<Ratio>,
    /// Replaces `deviceCoreScaling`.
    pub core_scaling: Option<Ratio>,
    /// Replaces the device filter.
    pub filter: Option<DeviceFilter>,
}

impl SharingConfig {
    /// The configuration for `node`: the cluster-wide settings with the node's override applied.
    ///
    /// # Errors
    /// [`ConfigError`] when two overrides name the same node (which one wins would be a guess),
    /// or the result is invalid.
    pub fn for_node(&self, overrides: &[NodeOverride], node: &str) -> Result<Self, ConfigError> {
        let mut matching = overrides.iter().filter(|o| o.nodes.iter().any(|n| n == node));
        let mut config = self.clone();
        if let Some(o) = matching.next() {
            if matching.next().is_some() {
                return Err(ConfigError { key: "nodeConfig", reason: format!("node {node} is named by more than one override") });
            }
            config.device_split_count = o.device_split_count.unwrap_or(config.device_split_count);
            config.memory_scaling = o.memory_scaling.unwrap_or(config.memory_scaling);
            config.core_scaling = o.core_scaling.unwrap_or(config.core_scaling);
            if let Some(filter) = &o.filter {
                config.filter = filter.clone();
            }
        }
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_apply_to_their_nodes_only() {
        let base = SharingConfig::default();
        let overrides = [NodeOverride {
            nodes: vec!["big-1".into()],
            device_split_count: Some(4),
            memory_scaling: Some(Ratio::parse("deviceMemoryScaling", "1.5").unwrap()),
            ..Default::default()
        }];
        let big = base.for_node(&overrides, "big-1").unwrap();
        assert_eq!(big.device_split_count, 4);
        assert_eq!(big.memory_scaling.to_string(), "1500m");
        assert!(big.core_scaling.is_one());
        assert_eq!(base.for_node(&overrides, "small-1").unwrap(), base);
    }

    #[test]
    fn ambiguous_or_invalid_overrides_are_refused_with_the_key() {
        let base = SharingConfig::default();
        let twice = [
            NodeOverride { nodes: vec!["n".into()], ..Default::default() },
            NodeOverride { nodes: vec!["n".into()], ..Default::default() },
        ];
        assert_eq!(base.for_node(&twice, "n").unwrap_err().key, "nodeConfig");
        let zero = [NodeOverride { nodes: vec!["n".into()], device_split_count: Some(0), ..Default::default() }];
        assert_eq!(base.for_node(&zero, "n").unwrap_err().to_string(), "deviceSplitCount: must be at least 1");
    }
}
