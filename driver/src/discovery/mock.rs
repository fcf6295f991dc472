//! The mock inventory as a device source: the cards of a `--mock-gpus` spec
//! ([`vgpu_scheduling::mock`]) served as this node's GPUs.

use vgpu_scheduling::Inventory;
pub use vgpu_scheduling::mock::{MockCards, MockSpecError, mock_uuid, parse_spec};

use super::source::{DeviceSource, DiscoveryError};

/// A mock device source for one node.
#[derive(Debug, Clone)]
pub struct MockSource {
    node_name: String,
    cards: Vec<MockCards>,
}

impl MockSource {
    /// A source serving `cards` as the GPUs of `node_name`.
    pub fn new(node_name: impl Into<String>, cards: Vec<MockCards>) -> Self {
        Self { node_name: node_name.into(), cards }
    }
}

impl DeviceSource for MockSource {
    fn inventory(&self) -> Result<Inventory, DiscoveryError> {
        Ok(vgpu_scheduling::mock::inventory(&self.node_name, &self.cards))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_source_serves_the_specs_inventory_the_same_on_every_read() {
        let src = MockSource::new("n1", parse_spec("2xTesla T4:15Gi").unwrap());
        let a = src.inventory().unwrap();
        assert_eq!(a, src.inventory().unwrap());
        assert_eq!(a, vgpu_scheduling::mock::inventory("n1", &parse_spec("2xTesla T4:15Gi").unwrap()));
        assert_eq!(a.gpus[1].uuid, mock_uuid("n1", 1));
    }
}
