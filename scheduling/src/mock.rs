//! The mock inventory: GPUs described on the command line (`--mock-gpus '2xTesla T4:15Gi'`), for
//! clusters, previews and tests without GPUs. Mock cards get stable UUIDs derived from node name
//! and index, so a restarted driver publishes the same devices. Pure: the node driver serves it
//! as a device source, `vgpu-dra convert` publishes it on paper.

use sha2::{Digest, Sha256};

use crate::{Gpu, Health, Inventory, Quantity};

/// A malformed item of a `--mock-gpus` spec; the message quotes the item.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--mock-gpus item {item:?}: {reason}")]
pub struct MockSpecError {
    /// The item as given.
    pub item: String,
    /// What is wrong with it.
    pub reason: String,
}

/// One item of the spec: `count` cards of `product` with `memory_bytes` each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MockCards {
    /// How many identical cards.
    pub count: u32,
    /// Product name.
    pub product: String,
    /// Memory per card in bytes.
    pub memory_bytes: u64,
    /// Whether the cards are in MIG mode (with no instances yet): the `:mig` suffix.
    pub mig_mode: bool,
}

/// Parses `[COUNTx]PRODUCT:MEMORY[:mig][,...]`, for example `8xNVIDIA H200:141Gi,RTX 3060:12Gi`
/// or `NVIDIA A800-SXM4-80GB:80Gi:mig` for a card in MIG mode.
///
/// # Errors
/// [`MockSpecError`] naming the first bad item.
pub fn parse_spec(spec: &str) -> Result<Vec<MockCards>, MockSpecError> {
    spec.split(',').map(parse_item).collect()
}

fn parse_item(raw: &str) -> Result<MockCards, MockSpecError> {
    let item = raw.trim();
    let err = |reason: &str| MockSpecError { item: item.to_owned(), reason: reason.to_owned() };
    if item.is_empty() {
        return Err(err("empty item; expected [COUNTx]PRODUCT:MEMORY[:mig]"));
    }
    let (item_rest, mig_mode) = match item.rsplit_once(':') {
        Some((rest, flag)) if flag.trim().eq_ignore_ascii_case("mig") => (rest, true),
        _ => (item, false),
    };
    let (head, memory) = item_rest.rsplit_once(':').ok_or_else(|| err("missing ':MEMORY', as in 'Tesla T4:15Gi'"))?;
    let digits = head.bytes().take_while(u8::is_ascii_digit).count();
    let (count, product) = match head[digits..].strip_prefix('x') {
        Some(product) if digits > 0 => {
            let count: u32 = head[..digits].parse().map_err(|_| err("count is too large"))?;
            (count, product)
        }
        _ => (1, head),
    };
    if count == 0 || count > 128 {
        return Err(err("count must be 1 to 128"));
    }
    let product = product.trim();
    if product.is_empty() {
        return Err(err("missing product name"));
    }
    let memory = memory.trim();
    let quantity = Quantity::parse(memory).map_err(|e| err(&e.to_string()))?;
    let memory_bytes = quantity
        .as_u64_exact()
        .filter(|b| *b >= 1 << 20)
        .ok_or_else(|| err(&format!("memory {memory} must be a whole number of bytes, at least 1Mi")))?;
    Ok(MockCards { count, product: product.to_owned(), memory_bytes, mig_mode })
}

/// The inventory of `node` holding `cards`, in order: minors and indexes count from 0.
pub fn inventory(node: &str, cards: &[MockCards]) -> Inventory {
    let mut gpus = Vec::new();
    for item in cards {
        for _ in 0..item.count {
            let index = u32::try_from(gpus.len()).unwrap_or(u32::MAX);
            gpus.push(mock_gpu(node, index, item));
        }
    }
    Inventory { driver_version: "550.54.15".into(), cuda_driver_version: (12, 4), gpus }
}

fn mock_gpu(node: &str, index: u32, cards: &MockCards) -> Gpu {
    let (architecture, compute_capability) = guess_architecture(&cards.product);
    Gpu {
        uuid: mock_uuid(node, index),
        minor: index,
        index,
        product_name: cards.product.clone(),
        brand: if cards.product.contains("RTX") || cards.product.contains("GeForce") { "GeForce" } else { "Tesla" }.into(),
        memory_bytes: cards.memory_bytes,
        architecture: architecture.into(),
        compute_capability,
        pci_bus_id: format!("0000:{:02x}:00.0", index + 1),
        pcie_root: Some("pci0000:00".into()),
        multiprocessors: 0,
        mig: cards.mig_mode.then(Vec::new),
        health: Health::Healthy,
    }
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` from a hash of node name and index.
pub fn mock_uuid(node: &str, index: u32) -> String {
    let digest = Sha256::digest(format!("vgpu-dra-mock/{node}/{index}"));
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

/// A plausible architecture for well-known product names, so mock slices look like real ones.
fn guess_architecture(product: &str) -> (&'static str, (u32, u32)) {
    let p = product.to_ascii_uppercase();
    let has = |s: &str| p.contains(s);
    if has("H100") || has("H200") || has("H20") || has("H800") {
        ("Hopper", (9, 0))
    } else if has("B200") || has("B100") {
        ("Blackwell", (10, 0))
    } else if has("L4") || has("L40") || has("RTX 40") || has("ADA") {
        ("Ada Lovelace", (8, 9))
    } else if has("A100") || has("A30") || has("A800") {
        ("Ampere", (8, 0))
    } else if has("A10") || has("A40") || has("RTX 30") || has("A16") || has("A2") {
        ("Ampere", (8, 6))
    } else if has("T4") || has("RTX 20") {
        ("Turing", (7, 5))
    } else if has("V100") {
        ("Volta", (7, 0))
    } else {
        ("", (0, 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_counts_products_with_spaces_and_quantities() {
        let cards = parse_spec("8xNVIDIA H200:141Gi,RTX 3060:12Gi").unwrap();
        assert_eq!(cards[0], MockCards { count: 8, product: "NVIDIA H200".into(), memory_bytes: 141 << 30, mig_mode: false });
        assert_eq!(cards[1], MockCards { count: 1, product: "RTX 3060".into(), memory_bytes: 12 << 30, mig_mode: false });
        assert_eq!(parse_spec("1xTesla T4:15Gi").unwrap()[0].memory_bytes, 15 << 30);
        assert_eq!(parse_spec("A100:40000Mi").unwrap()[0].memory_bytes, 40_000 << 20);
    }

    #[test]
    fn a_mig_suffix_puts_the_cards_in_mig_mode_without_instances() {
        let cards = parse_spec("2xNVIDIA A800-SXM4-80GB:80Gi:mig,Tesla T4:15Gi:MIG,A30:24Gi").unwrap();
        assert_eq!(
            cards[0],
            MockCards { count: 2, product: "NVIDIA A800-SXM4-80GB".into(), memory_bytes: 80 << 30, mig_mode: true }
        );
        assert!(cards[1].mig_mode && cards[1].memory_bytes == 15 << 30);
        assert!(!cards[2].mig_mode);
        let inv = inventory("n1", &cards);
        assert_eq!(inv.gpus[0].mig.as_deref(), Some(&[][..]));
        assert_eq!(inv.gpus[3].mig, None);
        let err = parse_spec("T4:mig").unwrap_err().to_string();
        assert!(err.contains("missing ':MEMORY'"), "{err}");
    }

    #[test]
    fn bad_items_are_named() {
        let cases = [
            ("Tesla T4", "missing ':MEMORY'"),
            ("1xTesla T4:15Gi,,", "empty item"),
            ("0xT4:15Gi", "count must be 1 to 128"),
            ("2x:15Gi", "missing product name"),
            ("T4:15 GiB", "is invalid"),
            ("T4:100", "at least 1Mi"),
            ("T4:1.5", "whole number of bytes"),
        ];
        for (spec, want) in cases {
            let err = parse_spec(spec).unwrap_err().to_string();
            assert!(err.starts_with("--mock-gpus item \"") && err.contains(want), "{spec:?}: {err}");
        }
    }

    #[test]
    fn uuids_are_stable_per_node_and_index() {
        let cards = parse_spec("2xTesla T4:15Gi").unwrap();
        let a = inventory("n1", &cards);
        let b = inventory("n1", &cards);
        assert_eq!(a, b);
        assert_ne!(a.gpus[0].uuid, a.gpus[1].uuid);
        assert_ne!(mock_uuid("n1", 0), mock_uuid("n2", 0));
        assert_eq!(a.gpus[0].uuid.len(), 40);
        assert_eq!(a.gpus[1].minor, 1);
        assert_eq!(a.gpus[0].architecture, "Turing");
    }
}
