//! CDI naming rules: `vendor/class` kinds, device names and qualified device IDs.

use std::fmt;

/// A name that breaks CDI's naming rules; the message names the part and the offending character.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The kind has no `/` between vendor and class.
    #[error("CDI kind {0:?} is not of the form vendor/class")]
    KindShape(String),
    /// The vendor part of a kind is invalid.
    #[error("CDI vendor {name:?} is invalid: {reason}")]
    Vendor {
        /// The vendor as given.
        name: String,
        /// Which rule it breaks.
        reason: String,
    },
    /// The class part of a kind is invalid.
    #[error("CDI class {name:?} is invalid: {reason}")]
    Class {
        /// The class as given.
        name: String,
        /// Which rule it breaks.
        reason: String,
    },
    /// A device name is invalid.
    #[error("CDI device name {name:?} is invalid: {reason}")]
    Device {
        /// The device name as given.
        name: String,
        /// Which rule it breaks.
        reason: String,
    },
}

/// Checks a name against CDI's shared rule shape: first character by `first`, last alphanumeric,
/// inner characters alphanumeric or one of `extra`.
fn check(name: &str, first_letter_only: bool, extra: &[char]) -> Result<(), String> {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return Err("it is empty".into());
    };
    let first_ok = if first_letter_only { first.is_ascii_alphabetic() } else { first.is_ascii_alphanumeric() };
    if !first_ok {
        let what = if first_letter_only { "a letter" } else { "a letter or digit" };
        return Err(format!("it must start with {what}, not {first:?}"));
    }
    if let Some(last) = name.chars().last()
        && !last.is_ascii_alphanumeric()
    {
        return Err(format!("it must end with a letter or digit, not {last:?}"));
    }
    if let Some(bad) = name.chars().find(|c| !c.is_ascii_alphanumeric() && !extra.contains(c)) {
        return Err(format!("character {bad:?} is not allowed"));
    }
    Ok(())
}

/// A CDI kind, `vendor/class`, such as `k8s.hami-core-gpu.project-hami.io/claim`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Kind {
    vendor: String,
    class: String,
}

impl Kind {
    /// Validates a `vendor/class` string.
    ///
    /// # Errors
    /// [`NameError`] naming the vendor or class part that breaks CDI's rules.
    pub fn parse(kind: &str) -> Result<Self, NameError> {
        let (vendor, class) = kind.split_once('/').ok_or_else(|| NameError::KindShape(kind.into()))?;
        Self::new(vendor, class)
    }

    /// Builds a kind from its two parts.
    ///
    /// # Errors
    /// [`NameError`] naming the part that breaks CDI's rules.
    pub fn new(vendor: &str, class: &str) -> Result<Self, NameError> {
        check(vendor, true, &['-', '_', '.']).map_err(|reason| NameError::Vendor { name: vendor.into(), reason })?;
        check(class, true, &['-', '_', '.']).map_err(|reason| NameError::Class { name: class.into(), reason })?;
        Ok(Self { vendor: vendor.into(), class: class.into() })
    }

    /// The vendor part.
    pub fn vendor(&self) -> &str {
        &self.vendor
    }

    /// The class part.
    pub fn class(&self) -> &str {
        &self.class
    }

    /// Stem for spec file names of this kind, `<vendor>-<class>` as CDI's transient specs use.
    pub fn file_stem(&self) -> String {
        format!("{}-{}", self.vendor, self.class)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.vendor, self.class)
    }
}

/// A device name within a CDI spec.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceName(String);

impl DeviceName {
    /// Validates a device name: starts and ends alphanumeric, inner `-_.:` allowed.
    ///
    /// # Errors
    /// [`NameError::Device`] with the rule it breaks.
    pub fn new(name: impl Into<String>) -> Result<Self, NameError> {
        let name = name.into();
        check(&name, false, &['-', '_', '.', ':']).map_err(|reason| NameError::Device { name: name.clone(), reason })?;
        Ok(Self(name))
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A fully qualified CDI device ID, `vendor/class=name`, as handed to container runtimes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QualifiedDeviceId {
    /// The kind of the spec that holds the device.
    pub kind: Kind,
    /// The device's name in that spec.
    pub name: DeviceName,
}

impl QualifiedDeviceId {
    /// Parses `vendor/class=name`.
    ///
    /// # Errors
    /// [`NameError`] for a missing `=` or an invalid part.
    pub fn parse(id: &str) -> Result<Self, NameError> {
        let (kind, name) = id.split_once('=').ok_or_else(|| NameError::KindShape(id.into()))?;
        Ok(Self { kind: Kind::parse(kind)?, name: DeviceName::new(name)? })
    }
}

impl fmt::Display for QualifiedDeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.kind, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_driver_kind_and_claim_device_names() {
        let kind = Kind::parse("k8s.hami-core-gpu.project-hami.io/claim").unwrap();
        assert_eq!(kind.vendor(), "k8s.hami-core-gpu.project-hami.io");
        assert_eq!(kind.class(), "claim");
        let name = DeviceName::new("6f1c0a9e-1b2c-4d5e-8f90-0123456789ab-hami-gpu-0").unwrap();
        let id = QualifiedDeviceId { kind, name };
        let text = id.to_string();
        assert_eq!(text, "k8s.hami-core-gpu.project-hami.io/claim=6f1c0a9e-1b2c-4d5e-8f90-0123456789ab-hami-gpu-0");
        assert_eq!(QualifiedDeviceId::parse(&text).unwrap(), id);
    }

    #[test]
    fn errors_name_the_bad_part() {
        let err = Kind::parse("vendor.io").unwrap_err();
        assert!(matches!(err, NameError::KindShape(_)), "{err}");
        let err = Kind::parse("1vendor/claim").unwrap_err().to_string();
        assert!(err.contains("vendor \"1vendor\"") && err.contains("start with a letter"), "{err}");
        let err = Kind::parse("vendor/cla$s").unwrap_err().to_string();
        assert!(err.contains("class \"cla$s\"") && err.contains("'$'"), "{err}");
        let err = Kind::parse("vendor/class-").unwrap_err().to_string();
        assert!(err.contains("end with a letter or digit"), "{err}");
        let err = DeviceName::new("gpu/0").unwrap_err().to_string();
        assert!(err.contains("device name \"gpu/0\"") && err.contains("'/'"), "{err}");
        assert!(DeviceName::new("").is_err());
        assert!(DeviceName::new("0").is_ok());
        assert!(DeviceName::new("a:b.c_d-e").is_ok());
        assert!(QualifiedDeviceId::parse("v/c").is_err());
    }
}
