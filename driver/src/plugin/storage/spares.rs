//! Temp files made ahead for the next prepares' records and specs: invisible to the kubelet and
//! the runtime, removed when dropped, and by start-up after a crash.

/// The temp files made ahead, and how many are being made. Changed one push, pop or counter
/// step at a time, so a panic while it is held cannot leave it half-updated.
#[derive(Default)]
pub struct Spares {
    /// A record's and a spec's temp file, one pair per claim to come.
    pub files: Vec<(crate::fsutil::Reserved, cdi_spec::ReservedSpec)>,
    /// Pairs being made on blocking threads now.
    pub making: usize,
}
