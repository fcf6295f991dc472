//! `usage --namespace`: what a namespace's claims on the driver's class hold of each GPU quota
//! key, beside its limit (the API server's quota status cannot show these keys, since it does
//! not count claims in them). The same arithmetic as the webhook's check
//! ([`vgpu_scheduling::quota`]), over the claims that exist.

use std::io::Write;

use k8s_openapi::api::core::v1::ResourceQuota;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use vgpu_scheduling::compat::{ClassFacts, FlavourOptions, device_classes, flavours};
use vgpu_scheduling::quota::{Charge, Limits, charge, quota_keys};

use crate::table::Table;

/// One row per GPU quota key of the namespace's ResourceQuotas: quota, key, used, limit.
pub fn rows(quotas: &[ResourceQuota], claims: &[ResourceClaim], slices: &[ResourceSlice], driver: &str) -> Vec<[String; 4]> {
    let options = FlavourOptions { driver: Some(driver.to_owned()), ..FlavourOptions::default() };
    let sets = flavours(None, &options);
    // The MIG class too: the webhook charges its claims (as whole cards) to the same keys.
    let classes = device_classes(&sets);
    let facts = ClassFacts::from_slices(slices, driver);
    let used = claims.iter().filter_map(|c| charge(&c.spec, &classes, &facts)).fold(Charge::default(), Charge::plus);
    Limits::from_quotas(quotas, &quota_keys(&sets))
        .0
        .into_iter()
        .map(|l| [l.quota, l.key, used.get(l.dimension).to_string(), l.hard.to_string()])
        .collect()
}

/// The rows as a table, or a line saying the namespace has no GPU quota.
///
/// # Errors
/// When `out` fails.
pub fn write(namespace: &str, rows: &[[String; 4]], out: &mut dyn Write) -> std::io::Result<()> {
    if rows.is_empty() {
        return writeln!(out, "No ResourceQuota in {namespace} names a GPU key (nvidia.com/gpu, gpumem, gpucores or Volcano's).");
    }
    let mut table = Table::new(&["QUOTA", "KEY", "USED", "LIMIT"]);
    for row in rows {
        table.row(row.to_vec());
    }
    table.write(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;
    use crate::test_fixtures::{DRIVER, device, slice};

    #[test]
    fn each_key_shows_what_the_claims_hold_in_hamis_units() {
        let quota: ResourceQuota = serde_json::from_value(json!({"metadata": {"name": "gpu"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "2000", "requests.nvidia.com/gpucores": "50", "cpu": "2"}}}))
        .unwrap();
        let claim = |memory: &str, class: &str| -> ResourceClaim {
            serde_json::from_value(json!({"metadata": {"name": "c"}, "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": class, "capacity": {"requests": {"memory": memory, "cores": "20"}}}}]}}}))
            .unwrap()
        };
        let claims = [claim("1500Mi", DRIVER), claim("100Mi", DRIVER), claim("9Gi", "other.example.com")];
        // A MIG claim counts as the webhook charges it: a whole card of the largest model.
        let mig: ResourceClaim = serde_json::from_value(json!({"metadata": {"name": "m"}, "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": format!("mig.{DRIVER}")}}]}}}))
        .unwrap();
        let with_mig = rows(
            std::slice::from_ref(&quota),
            &[claims[0].clone(), mig],
            &[slice("n1", vec![device("hami-gpu-0", "Tesla T4", 15360, 10)])],
            DRIVER,
        );
        assert_eq!(with_mig[0][2], (1500 + 15360).to_string(), "{with_mig:?}");
        let slices = [slice("n1", vec![device("hami-gpu-0", "Tesla T4", 15360, 10)])];
        let got = rows(&[quota], &claims, &slices, DRIVER);
        assert_eq!(
            got,
            [
                ["gpu".to_owned(), "limits.nvidia.com/gpumem".to_owned(), "1600".to_owned(), "2000".to_owned()],
                ["gpu".to_owned(), "requests.nvidia.com/gpucores".to_owned(), "40".to_owned(), "50".to_owned()],
            ]
        );
        let mut out = Vec::new();
        write("ns", &[], &mut out).unwrap();
        assert!(String::from_utf8(out).unwrap().starts_with("No ResourceQuota in ns"));
    }
}
