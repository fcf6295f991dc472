#![allow(clippy::unwrap_used)]

use super::*;

const DAY: Duration = Duration::from_secs(86_400);

/// 2030-06-15T12:00:00Z: whole seconds, so dates written in certificates compare exactly.
fn june_2030() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_907_755_200)
}

#[test]
fn generated_bundle_round_trips_through_a_secret_and_serves() {
    crate::install_crypto_provider();
    let names = serving_names(Some("127.0.0.1"), Some(("vgpu-dra-webhook", "vgpu")));
    assert_eq!(names[1], "vgpu-dra-webhook.vgpu.svc");
    let bundle = CertBundle::generate(&names, 365 * DAY).unwrap();
    assert!(bundle.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
    assert_ne!(bundle.ca_pem, bundle.cert_pem);
    let secret = bundle.to_secret("vgpu", "tls");
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    assert_eq!(CertBundle::from_secret(&secret).unwrap(), bundle);
    let key = bundle.certified_key().unwrap();
    assert_eq!(key.cert.len(), 1);
    assert!(!format!("{bundle:?}").contains("PRIVATE KEY"));
    // A key of another bundle is refused rather than served.
    let other = CertBundle::generate(&names, DAY).unwrap();
    let mixed = CertBundle { key_pem: other.key_pem, ..bundle };
    assert!(matches!(mixed.certified_key(), Err(TlsError::Key(_))));
}

#[test]
fn the_serving_certificate_covers_its_names_and_no_other() {
    let names = serving_names(Some("[::1]"), Some(("wh", "ns")));
    let bundle = CertBundle::generate(&names, DAY).unwrap();
    assert!(bundle.covers(&names), "{names:?}");
    assert!(!bundle.covers(&["other.ns.svc".into()]));
    let other = CertBundle::generate(&names, DAY).unwrap();
    let mixed = CertBundle { ca_pem: other.ca_pem, ..bundle };
    assert!(!mixed.covers(&names), "a certificate of another CA");
}

#[test]
fn a_secret_without_the_key_is_refused_by_name() {
    let mut secret = CertBundle::generate(&["x".into()], DAY).unwrap().to_secret("n", "s");
    secret.data.as_mut().unwrap().remove(KEY_KEY);
    let err = CertBundle::from_secret(&secret).unwrap_err();
    assert_eq!(err.to_string(), "Secret n/s: tls.key is missing or not valid PEM");
}

#[test]
fn validity_is_dated_back_an_hour_and_forward_by_the_flag() {
    let now = june_2030();
    let bundle = CertBundle::generate_at(&["wh.ns.svc".into()], 30 * DAY, now).unwrap();
    let want = Validity { not_before: now - CLOCK_SKEW, not_after: now + 30 * DAY };
    assert_eq!(bundle.validity(), Some(want));
    let ca = CertificateDer::from_pem_slice(bundle.ca_pem.as_bytes()).unwrap();
    assert_eq!(Validity::of(&ca), Some(want), "the CA expires with its certificate");
    assert!(bundle.covers_at(&["wh.ns.svc".into()], now + 29 * DAY));
    assert!(!bundle.covers_at(&["wh.ns.svc".into()], now + 31 * DAY), "expired");
    // From 2050 on, certificates carry GeneralizedTime instead of UTCTime.
    let later = now + 9000 * DAY;
    let bundle = CertBundle::generate_at(&["x".into()], DAY, later).unwrap();
    assert_eq!(bundle.validity(), Some(Validity { not_before: later - CLOCK_SKEW, not_after: later + DAY }));
}

#[test]
fn dates_and_malformed_certificates() {
    assert_eq!(days_since_epoch(1970, 1, 1), 0);
    assert_eq!(days_since_epoch(2000, 3, 1), 11_017);
    assert_eq!(days_since_epoch(2024, 2, 29), 19_782);
    assert_eq!(days_since_epoch(1969, 12, 31), -1);
    assert_eq!(asn1_time(UTC_TIME, b"491231235959Z"), Some(UNIX_EPOCH + Duration::from_secs(2_524_607_999)));
    assert_eq!(asn1_time(UTC_TIME, b"700101000000Z"), Some(UNIX_EPOCH));
    for bad in [&b"7001010000Z"[..], b"700101000000", b"701301000000Z", b"70010100000+Z"] {
        assert_eq!(asn1_time(UTC_TIME, bad), None, "{}", String::from_utf8_lossy(bad));
    }
    assert_eq!(asn1_time(GENERALIZED_TIME, b"700101000000Z"), None, "GeneralizedTime has four year digits");
    let der = CertificateDer::from_pem_slice(CertBundle::generate(&["x".into()], DAY).unwrap().cert_pem.as_bytes()).unwrap();
    assert!(Validity::of(&der).is_some());
    for cut in [0, 1, 10, 100] {
        assert_eq!(Validity::of(&der[..cut]), None, "cut at {cut}");
    }
}

#[test]
fn renewal_is_due_in_the_last_third_and_for_a_certificate_living_too_long() {
    let names = vec!["wh.ns.svc".to_owned()];
    let now = SystemTime::now();
    let year = 365 * DAY;
    let fresh = CertBundle::generate_at(&names, year, now - 200 * DAY).unwrap();
    assert_eq!(fresh.renewal_reason(&names, year, now), None, "165 of 365 days left");
    let old = CertBundle::generate_at(&names, year, now - 250 * DAY).unwrap();
    assert_eq!(old.renewal_reason(&names, year, now), Some("less than a third of its validity is left"));
    let expired = CertBundle::generate_at(&names, year, now - 400 * DAY).unwrap();
    assert!(expired.renewal_reason(&names, year, now).unwrap().contains("not valid now"));
    assert!(fresh.renewal_reason(&["other.ns.svc".into()], year, now).unwrap().contains("does not cover"));
    assert_eq!(fresh.renewal_reason(&names, 30 * DAY, now), Some("it is valid for longer than --certificate-validity-days"));
}

#[test]
fn earlier_cas_still_valid_are_kept_after_the_new_one() {
    let names = vec!["wh.ns.svc".to_owned()];
    let now = SystemTime::now();
    let old = CertBundle::generate_at(&names, 365 * DAY, now - 250 * DAY).unwrap();
    let expired = CertBundle::generate_at(&names, 365 * DAY, now - 400 * DAY).unwrap();
    let new = CertBundle::generate_at(&names, 365 * DAY, now).unwrap();
    let first = new.ca_certificates()[0].to_owned();
    let merged = new.with_earlier_cas(&format!("{}{}{}", old.ca_pem, expired.ca_pem, first), now);
    assert_eq!(merged.ca_certificates(), [first.as_str(), old.ca_certificates()[0]], "expired dropped, none twice");
    // One caBundle verifies either serving certificate.
    assert!(merged.covers(&names));
    assert!(CertBundle { cert_pem: old.cert_pem.clone(), ..merged.clone() }.covers(&names));
    assert!(!CertBundle { cert_pem: expired.cert_pem, ..merged.clone() }.covers(&names));
    // Nothing earlier: the bundle is its one CA.
    assert_eq!(merged.clone().with_earlier_cas("", now).ca_certificates().len(), 2);
}

#[test]
fn a_merged_ca_bundle_keeps_every_registered_ca_still_valid() {
    let names = vec!["wh.ns.svc".to_owned()];
    let now = SystemTime::now();
    let made = |days_ago: u32| CertBundle::generate_at(&names, 365 * DAY, now - days_ago * DAY).unwrap();
    let (old, current, renewed, expired) = (made(300), made(200), made(0), made(400));
    let first = |b: &CertBundle| b.ca_certificates()[0].to_owned();
    // Whatever the order replicas write in: a replica with an older Secret (starting during a
    // renewal), one that recreated a deleted Secret, an issuer's new CA.
    for (ours, registered) in [
        (&current, format!("{}{}", renewed.ca_pem, current.ca_pem)),
        (&renewed, current.ca_pem.clone()),
        (&old, format!("{}{}{}", renewed.ca_pem, expired.ca_pem, current.ca_pem)),
        (&current, format!("{}garbage-----BEGIN CERTIFICATE-----\nbm90\n-----END CERTIFICATE-----\n", renewed.ca_pem)),
    ] {
        let merged = merge_ca_bundles(&ours.ca_pem, &registered, now);
        let blocks = pem_certificates(&merged);
        assert_eq!(blocks[0], first(ours), "ours first");
        for kept in pem_certificates(&registered).into_iter().filter(|b| *b != first(&expired) && b.contains("MII")) {
            assert!(blocks.contains(&kept), "a registered CA still valid was dropped");
        }
        assert!(!blocks.contains(&first(&expired).as_str()), "expired");
        assert!(!merged.contains("bm90"), "unreadable");
        assert_eq!(blocks.len(), blocks.iter().collect::<std::collections::BTreeSet<_>>().len(), "each once");
        // So every serving certificate of these bundles is trusted by the registered bundle.
        for served in [ours, &current, &renewed] {
            if registered.contains(&first(served)) || served == ours {
                assert!(CertBundle { ca_pem: merged.clone(), ..served.clone() }.covers(&names));
            }
        }
    }
    // Bounded, the newest kept: ours plus the newest registered.
    let many: Vec<CertBundle> = (0..10).map(|i| made(10 * i)).collect();
    let registered: String = many.iter().map(|b| b.ca_pem.clone()).collect();
    let merged = merge_ca_bundles(&old.ca_pem, &registered, now);
    let blocks = pem_certificates(&merged);
    assert_eq!(blocks.len(), MAX_REGISTERED_CAS);
    assert_eq!(blocks[0], first(&old));
    let newest: Vec<String> = many.iter().take(MAX_REGISTERED_CAS - 1).map(first).collect();
    assert_eq!(blocks[1..].iter().map(|b| (*b).to_owned()).collect::<Vec<_>>(), newest);
}
