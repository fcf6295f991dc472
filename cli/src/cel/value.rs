//! The values and errors of the CEL subset.

use std::collections::BTreeMap;

use vgpu_scheduling::Quantity;

/// Why an expression has no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CelError {
    /// The expression uses CEL this evaluator does not implement.
    #[error("unsupported CEL: {0}")]
    Unsupported(String),
    /// The expression is valid but fails on this device (as the scheduler's CEL would fail).
    #[error("{0}")]
    Runtime(String),
}

/// A CEL value of the device environment.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `bool`.
    Bool(bool),
    /// `int`.
    Int(i64),
    /// `string`.
    Str(String),
    /// A semantic version (`semver(...)`, version attributes): major, minor, patch.
    Version(u64, u64, u64),
    /// A Kubernetes quantity (`quantity(...)`, capacities).
    Quantity(Quantity),
    /// `list`.
    List(Vec<Value>),
    /// `map` with string keys (`device.attributes`, `device.capacity` and their domains).
    Map(BTreeMap<String, Value>),
}

impl Value {
    /// A version value from `1.2.3` (pre-release and build parts are not compared).
    pub fn version(text: &str) -> Option<Self> {
        let core = text.split(['-', '+']).next()?;
        let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
        let v = (parts.next()??, parts.next()??, parts.next()??);
        parts.next().is_none().then_some(Self::Version(v.0, v.1, v.2))
    }

    pub(super) fn type_name(&self) -> &'static str {
        match self {
            Self::Bool(_) => "bool",
            Self::Int(_) => "int",
            Self::Str(_) => "string",
            Self::Version(..) => "semver",
            Self::Quantity(_) => "quantity",
            Self::List(_) => "list",
            Self::Map(_) => "map",
        }
    }
}
