//! A mock inventory read from a JSON or YAML file on every read, so tests and operators can change
//! cards and health by editing it. A card can also simulate a driver in trouble
//! (`simulate: hang` or `simulate: fail` beside its fields), to show that one bad card does not
//! hold up the others. One-shot reads (`vgpu-dra inventory`) simulate it too: they hang as NVML
//! would.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use vgpu_scheduling::{Gpu, Inventory};

use super::source::{CardList, DeviceSource, DiscoveryError, read_all};

/// How often a hanging card's read looks at the file again to see whether it may return.
const HANG_RECHECK: Duration = Duration::from_millis(100);

/// What a mock card's reads do besides answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Simulate {
    /// Reads of the card block until the file no longer says so, like an NVML call on a wedged
    /// card.
    Hang,
    /// Reads of the card fail.
    Fail,
}

/// The file as read: the inventory, and what each card (by index) simulates.
struct MockInventory {
    inventory: Inventory,
    simulate: Vec<(u32, Simulate)>,
}

/// Takes the `simulate` fields out of the cards of `file`, so the rest is parsed as a strict
/// [`Inventory`] (unknown fields are still refused).
fn split_simulate(mut file: serde_json::Value) -> Result<MockInventory, String> {
    let mut by_position = Vec::new();
    if let Some(gpus) = file.get_mut("gpus").and_then(serde_json::Value::as_array_mut) {
        for (position, gpu) in gpus.iter_mut().enumerate() {
            if let Some(simulate) = gpu.as_object_mut().and_then(|g| g.remove("simulate")) {
                let simulate: Simulate =
                    serde_json::from_value(simulate).map_err(|e| format!("gpus[{position}].simulate: {e}"))?;
                by_position.push((position, simulate));
            }
        }
    }
    let inventory: Inventory = serde_json::from_value(file).map_err(|e| e.to_string())?;
    let simulate = by_position.into_iter().filter_map(|(p, s)| Some((inventory.gpus.get(p)?.index, s))).collect();
    Ok(MockInventory { inventory, simulate })
}

/// A mock inventory file, re-read on every call.
#[derive(Debug, Clone)]
pub struct MockFileSource {
    path: PathBuf,
}

impl MockFileSource {
    /// A source reading `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn read(&self) -> Result<MockInventory, DiscoveryError> {
        let err = |reason: String| DiscoveryError::MockFile { path: self.path.clone(), reason };
        let text = std::fs::read_to_string(&self.path).map_err(|e| err(e.to_string()))?;
        let file: serde_json::Value = if self.path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).map_err(|e| err(e.to_string()))?
        } else {
            serde_saphyr::from_str(&text).map_err(|e| err(e.to_string()))?
        };
        split_simulate(file).map_err(err)
    }

    /// Card `index` and what it simulates.
    fn read_card(&self, index: u32) -> Result<(Gpu, Option<Simulate>), DiscoveryError> {
        let file = self.read()?;
        let simulate = file.simulate.iter().find(|(i, _)| *i == index).map(|(_, s)| *s);
        let gpu = file.inventory.gpus.into_iter().find(|g| g.index == index).ok_or(DiscoveryError::NoSuchCard { index })?;
        Ok((gpu, simulate))
    }
}

impl DeviceSource for MockFileSource {
    fn inventory(&self) -> Result<Inventory, DiscoveryError> {
        read_all(self)
    }

    fn cards(&self) -> Result<CardList, DiscoveryError> {
        let Inventory { driver_version, cuda_driver_version, gpus } = self.read()?.inventory;
        Ok(CardList { driver_version, cuda_driver_version, indices: gpus.iter().map(|g| g.index).collect() })
    }

    fn card(&self, index: u32) -> Result<Gpu, DiscoveryError> {
        loop {
            let (gpu, simulate) = self.read_card(index)?;
            match simulate {
                None => return Ok(gpu),
                Some(Simulate::Fail) => {
                    return Err(DiscoveryError::MockFile {
                        path: self.path.clone(),
                        reason: format!("card {index} simulates a failing read"),
                    });
                }
                Some(Simulate::Hang) => std::thread::sleep(HANG_RECHECK),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use vgpu_scheduling::Health;

    use super::*;

    const YAML: &str = "driverVersion: 550.54.15
cudaDriverVersion: [12, 4]
gpus:
- {uuid: GPU-a, minor: 0, index: 0, productName: Tesla T4, memoryBytes: 16106127360}
- {uuid: GPU-b, minor: 1, index: 1, productName: Tesla T4, memoryBytes: 16106127360, health: unhealthy, simulate: SIM}
";

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        path
    }

    #[test]
    fn reads_yaml_and_json_with_and_without_simulate() {
        let dir = tempfile::tempdir().unwrap();
        let plain = write(dir.path(), "inv.yaml", &YAML.replace(", simulate: SIM", ""));
        let inv = MockFileSource::new(&plain).inventory().unwrap();
        assert_eq!(inv.cuda_driver_version, (12, 4));
        assert_eq!(inv.gpus.len(), 2);
        assert_eq!(inv.gpus[1].health, Health::Unhealthy);
        assert_eq!(inv.gpus[0].memory_bytes, 15 << 30);

        let json = serde_json::json!({"gpus": [{"uuid": "GPU-a", "minor": 0, "index": 0, "productName": "T4",
            "memoryBytes": 1u64 << 30, "simulate": "fail"}]});
        let path = write(dir.path(), "inv.json", &json.to_string());
        let src = MockFileSource::new(&path);
        assert_eq!(src.cards().unwrap().indices, [0]);
        let err = src.card(0).unwrap_err().to_string();
        assert!(err.contains("card 0 simulates a failing read"), "{err}");
    }

    #[test]
    fn unknown_fields_are_still_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "inv.yaml", &YAML.replace("simulate: SIM", "colour: red"));
        let err = MockFileSource::new(&path).cards().unwrap_err().to_string();
        assert!(err.contains("colour"), "{err}");
        let path = write(dir.path(), "inv2.yaml", &YAML.replace("simulate: SIM", "simulate: explode"));
        assert!(MockFileSource::new(&path).cards().is_err());
    }

    #[test]
    fn a_hanging_card_returns_once_the_file_lets_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "inv.yaml", &YAML.replace("SIM", "hang"));
        let src = MockFileSource::new(&path);
        assert_eq!(src.card(0).unwrap().uuid, "GPU-a", "the other card answers");
        let (tx, rx) = mpsc::channel();
        let reader = src.clone();
        std::thread::spawn(move || {
            let _ = tx.send(reader.card(1));
        });
        assert!(rx.recv_timeout(Duration::from_millis(400)).is_err(), "card 1 should hang");
        write(dir.path(), "inv.yaml", &YAML.replace(", simulate: SIM", ""));
        let gpu = rx.recv_timeout(Duration::from_secs(5)).unwrap().unwrap();
        assert_eq!(gpu.uuid, "GPU-b");
    }
}
