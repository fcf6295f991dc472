//! The cards of the cluster as the scheduler sees them: every device our driver publishes in a
//! ResourceSlice, with its capacities (and their request policies), attributes and taints.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{CapacityRequestPolicy, Device, DeviceAttribute, DeviceTaint, ResourceSlice};
use vgpu_scheduling::policy::{Capacity, RequestPolicy, ValidRequests};
use vgpu_scheduling::{Format, Quantity};

use crate::cel::Value;

/// One published device of our driver.
#[derive(Debug, Clone)]
pub struct Card {
    /// The node of the slice (`spec.nodeName`), empty for slices without one.
    pub node: String,
    /// The pool (the node's name for our driver).
    pub pool: String,
    /// The device name, `hami-gpu-<minor>`.
    pub device: String,
    /// Attributes with qualified names: `<driver>/productName`, `resource.kubernetes.io/pcieRoot`.
    pub attributes: BTreeMap<String, Value>,
    /// Consumable capacities by name.
    pub capacity: BTreeMap<String, Capacity>,
    /// The device's taints.
    pub taints: Vec<DeviceTaint>,
    /// Whether several claims can share the device.
    pub shareable: bool,
}

/// `key=value:Effect`, or `key:Effect` without a value.
pub fn taint_text(t: &DeviceTaint) -> String {
    match &t.value {
        Some(v) => format!("{}={v}:{}", t.key, t.effect),
        None => format!("{}:{}", t.key, t.effect),
    }
}

/// A capacity or attribute value in a slice that is not what the API allows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("ResourceSlice {slice}, device {device}: {what}")]
pub struct CardError {
    /// The slice.
    pub slice: String,
    /// The device.
    pub device: String,
    /// What is wrong.
    pub what: String,
}

impl Card {
    /// The `productName` attribute, or empty.
    pub fn product(&self, driver: &str) -> String {
        match self.attributes.get(&format!("{driver}/productName")) {
            Some(Value::Str(s)) => s.clone(),
            _ => String::new(),
        }
    }

    /// The `uuid` attribute, or empty.
    pub fn uuid(&self, driver: &str) -> String {
        match self.attributes.get(&format!("{driver}/uuid")) {
            Some(Value::Str(s)) => s.clone(),
            _ => String::new(),
        }
    }

    /// The total of capacity `name`, if the device has it.
    pub fn total(&self, name: &str) -> Option<Quantity> {
        self.capacity.get(name).map(|c| c.value)
    }

    /// `key=value:effect` of each taint, or `healthy`.
    pub fn health(&self) -> String {
        if self.taints.is_empty() {
            return "healthy".into();
        }
        self.taints.iter().map(taint_text).collect::<Vec<_>>().join(",")
    }

    /// The CEL `device` variable for `driver`'s selectors: `driver`, `attributes` and `capacity`
    /// keyed by domain, `allowMultipleAllocations`.
    pub fn cel_device(&self, driver: &str) -> Value {
        let mut attributes: BTreeMap<String, Value> = BTreeMap::new();
        for (qualified, value) in &self.attributes {
            let (domain, name) = qualified.rsplit_once('/').unwrap_or((driver, qualified));
            let entry = attributes.entry(domain.to_owned()).or_insert_with(|| Value::Map(BTreeMap::new()));
            if let Value::Map(m) = entry {
                m.insert(name.to_owned(), value.clone());
            }
        }
        let capacity: BTreeMap<String, Value> =
            self.capacity.iter().map(|(name, c)| (name.clone(), Value::Quantity(c.value))).collect();
        Value::Map(BTreeMap::from([
            ("driver".to_owned(), Value::Str(driver.to_owned())),
            ("attributes".to_owned(), Value::Map(attributes)),
            ("capacity".to_owned(), Value::Map(BTreeMap::from([(driver.to_owned(), Value::Map(capacity))]))),
            ("allowMultipleAllocations".to_owned(), Value::Bool(self.shareable)),
        ]))
    }
}

/// The devices of `driver` in `slices`, ordered by node and device name.
///
/// # Errors
/// [`CardError`] for a quantity the API would not have stored.
pub fn cards(slices: &[ResourceSlice], driver: &str) -> Result<Vec<Card>, CardError> {
    let mut out = Vec::new();
    for slice in slices.iter().filter(|s| s.spec.driver == driver) {
        let name = slice.metadata.name.clone().unwrap_or_default();
        for device in slice.spec.devices.iter().flatten() {
            out.push(card(slice, device, driver).map_err(|what| CardError {
                slice: name.clone(),
                device: device.name.clone(),
                what,
            })?);
        }
    }
    out.sort_by(|a, b| (&a.node, &a.device).cmp(&(&b.node, &b.device)));
    Ok(out)
}

fn card(slice: &ResourceSlice, device: &Device, driver: &str) -> Result<Card, String> {
    let mut capacity = BTreeMap::new();
    for (name, c) in device.capacity.iter().flatten() {
        let value = quantity(&c.value.0)?;
        let policy = c.request_policy.as_ref().map(policy).transpose()?;
        capacity.insert(name.clone(), Capacity { value, policy });
    }
    let attributes = device
        .attributes
        .iter()
        .flatten()
        .filter_map(|(name, a)| {
            let qualified = if name.contains('/') { name.clone() } else { format!("{driver}/{name}") };
            attribute(a).map(|v| (qualified, v))
        })
        .collect();
    Ok(Card {
        node: slice.spec.node_name.clone().or_else(|| device.node_name.clone()).unwrap_or_default(),
        pool: slice.spec.pool.name.clone(),
        device: device.name.clone(),
        attributes,
        capacity,
        taints: device.taints.clone().unwrap_or_default(),
        shareable: device.allow_multiple_allocations.unwrap_or(false),
    })
}

fn quantity(text: &str) -> Result<Quantity, String> {
    Quantity::parse(text).map_err(|e| e.to_string())
}

fn policy(p: &CapacityRequestPolicy) -> Result<RequestPolicy, String> {
    let default = p.default.as_ref().map(|q| quantity(&q.0)).transpose()?;
    let valid = if let Some(range) = &p.valid_range {
        ValidRequests::Range {
            min: quantity(&range.min.0)?,
            max: range.max.as_ref().map(|q| quantity(&q.0)).transpose()?,
            step: range.step.as_ref().map(|q| quantity(&q.0)).transpose()?,
        }
    } else if let Some(values) = &p.valid_values {
        let mut values: Vec<Quantity> = values.iter().map(|q| quantity(&q.0)).collect::<Result<_, _>>()?;
        values.sort();
        ValidRequests::Values(values)
    } else {
        ValidRequests::Any
    };
    Ok(RequestPolicy { default, valid })
}

fn attribute(a: &DeviceAttribute) -> Option<Value> {
    if let Some(s) = &a.string {
        return Some(Value::Str(s.clone()));
    }
    if let Some(i) = a.int {
        return Some(Value::Int(i));
    }
    if let Some(b) = a.bool {
        return Some(Value::Bool(b));
    }
    if let Some(v) = &a.version {
        return Value::version(v);
    }
    if let Some(list) = &a.strings {
        return Some(Value::List(list.iter().cloned().map(Value::Str).collect()));
    }
    if let Some(list) = &a.ints {
        return Some(Value::List(list.iter().copied().map(Value::Int).collect()));
    }
    None
}

/// The zero a sum of this capacity starts from, printed like its total (bytes in binary units).
pub fn zero_like(total: Quantity) -> Quantity {
    Quantity::ZERO.with_format(total.format())
}

/// `q` printed for people: memory in binary units when whole (`6000Mi`, `12Gi`), others as given.
pub fn show(name: &str, q: Quantity) -> String {
    if name == vgpu_scheduling::device::CAPACITY_MEMORY { q.with_format(Format::BinarySI).to_string() } else { q.to_string() }
}
