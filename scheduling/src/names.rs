//! Validated names: what the API hands us is checked once, at the edge, and carried typed.

use std::fmt;

/// A name that breaks its Kubernetes rule; the message names the kind of name and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?} is invalid: {reason}")]
pub struct NameError {
    /// Which kind of name (`device name`, `driver name`, `claim UID`).
    pub what: &'static str,
    /// The value as given.
    pub value: String,
    /// The rule it breaks.
    pub reason: &'static str,
}

fn is_dns_label(s: &str) -> Result<(), &'static str> {
    if s.is_empty() || s.len() > 63 {
        return Err("it must be 1 to 63 characters");
    }
    if !s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
        return Err("only lowercase letters, digits and '-' are allowed");
    }
    if s.starts_with('-') || s.ends_with('-') {
        return Err("it must start and end with a letter or digit");
    }
    Ok(())
}

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $what:literal, $check:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Validates and wraps the name.
            ///
            /// # Errors
            /// [`NameError`] naming the rule it breaks.
            pub fn new(value: impl Into<String>) -> Result<Self, NameError> {
                let value = value.into();
                let check: fn(&str) -> Result<(), &'static str> = $check;
                match check(&value) {
                    Ok(()) => Ok(Self(value)),
                    Err(reason) => Err(NameError { what: $what, value, reason }),
                }
            }

            /// The name as a string.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl TryFrom<String> for $name {
            type Error = NameError;
            fn try_from(value: String) -> Result<Self, NameError> {
                Self::new(value)
            }
        }

        impl From<$name> for String {
            fn from(name: $name) -> String {
                name.0
            }
        }
    };
}

name_type!(
    /// A device name in a ResourceSlice (a DNS label), such as `hami-gpu-0`.
    DeviceName, "device name", is_dns_label
);

name_type!(
    /// A DRA driver name: a DNS subdomain of at most 63 characters, such as
    /// `hami-core-gpu.project-hami.io`.
    DriverName, "driver name", |s| {
        if s.len() > 63 {
            return Err("it must be at most 63 characters");
        }
        if s.split('.').any(|label| is_dns_label(label).is_err()) {
            return Err("it must be dot-separated lowercase DNS labels");
        }
        Ok(())
    }
);

name_type!(
    /// A Kubernetes object UID (claim UIDs, share IDs): safe to use in file and CDI device names.
    Uid, "UID", |s| {
        if s.is_empty() || s.len() > 64 {
            return Err("it must be 1 to 64 characters");
        }
        if !s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err("only letters, digits and '-' are allowed");
        }
        if !s.as_bytes()[0].is_ascii_alphanumeric() || !s.as_bytes()[s.len() - 1].is_ascii_alphanumeric() {
            return Err("it must start and end with a letter or digit");
        }
        Ok(())
    }
);

name_type!(
    /// A namespace name (a DNS label), checked before it reaches an API path.
    Namespace, "namespace", is_dns_label
);

name_type!(
    /// An object name (a DNS subdomain: dot-separated DNS labels, at most 253 characters), such
    /// as a ResourceClaim's or a Pod's; checked before it reaches an API path, so a name like
    /// `c/status` can never address another object or a subresource.
    ObjectName, "object name", |s| {
        if s.is_empty() || s.len() > 253 {
            return Err("it must be 1 to 253 characters");
        }
        if s.split('.').any(|label| is_dns_label(label).is_err()) {
            return Err("it must be dot-separated lowercase DNS labels");
        }
        Ok(())
    }
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_errors_say_which_rule() {
        assert!(DeviceName::new("hami-gpu-0").is_ok());
        let err = DeviceName::new("GPU_0").unwrap_err().to_string();
        assert_eq!(err, "device name \"GPU_0\" is invalid: only lowercase letters, digits and '-' are allowed");
        assert!(DeviceName::new("-a").is_err());
        assert!(DeviceName::new("a".repeat(64)).is_err());
        assert!(DriverName::new("hami-core-gpu.project-hami.io").is_ok());
        assert!(DriverName::new("Bad.io").is_err());
        assert!(DriverName::new(format!("{}.io", "a".repeat(61))).is_err());
        assert!(Uid::new("6f1c0a9e-1b2c-4d5e-8f90-0123456789ab").is_ok());
        for bad in ["", "../x", "a/b", "a b", "-a"] {
            assert!(Uid::new(bad).is_err(), "{bad:?}");
        }
        let parsed: Uid = serde_json::from_str("\"abc-1\"").unwrap();
        assert_eq!(parsed.as_str(), "abc-1");
        assert!(serde_json::from_str::<Uid>("\"../etc\"").is_err());
    }

    #[test]
    fn object_names_never_carry_a_path() {
        for good in ["c", "gpu-claim-1", "a.b.c", &"a".repeat(63)] {
            assert!(ObjectName::new(good).is_ok(), "{good:?}");
        }
        for bad in ["", "c/status", "..", "a..b", ".a", "A", "a b", "c%2Fstatus", "c?x=1", &"a".repeat(254)] {
            assert!(ObjectName::new(bad).is_err(), "{bad:?}");
        }
        assert!(Namespace::new("default").is_ok());
        for bad in ["", "a.b", "a/b", "Default", &"a".repeat(64)] {
            assert!(Namespace::new(bad).is_err(), "{bad:?}");
        }
    }
}
