use proptest::prelude::*;

use super::*;

fn canon(s: &str) -> String {
    Quantity::parse(s).unwrap_or_else(|e| panic!("{s}: {e}")).to_string()
}

/// Input and the canonical form the API server returns for it (Kubernetes' documented quantity
/// behaviour: suffix family kept, factors of 1024 or 1000 folded, nano precision rounded up).
const REFERENCE: &[(&str, &str)] = &[
    ("0", "0"),
    ("0Ki", "0"),
    ("0.0", "0"),
    ("-0", "0"),
    ("1", "1"),
    ("+1", "1"),
    ("1000", "1k"),
    ("1500", "1500"),
    ("1024", "1024"),
    ("4294967296", "4294967296"),
    ("1Ki", "1Ki"),
    ("1024Ki", "1Mi"),
    ("4096Mi", "4Gi"),
    ("15Gi", "15Gi"),
    ("1.5Gi", "1536Mi"),
    ("0.5Gi", "512Mi"),
    ("0.5Ki", "512"),
    ("1.1Ki", "1126400m"),
    ("1023Ki", "1023Ki"),
    ("141Gi", "141Gi"),
    ("5Ei", "5Ei"),
    ("100m", "100m"),
    ("0.1", "100m"),
    ("1.5", "1500m"),
    ("1000m", "1"),
    ("1.000001", "1000001u"),
    ("1u", "1u"),
    ("123456789n", "123456789n"),
    ("0.000000001", "1n"),
    ("0.0000000001", "1n"),
    ("1e3", "1e3"),
    ("1E3", "1e3"),
    ("1e-3", "1e-3"),
    ("12e6", "12e6"),
    ("1000e3", "1e6"),
    ("1M", "1M"),
    ("1000k", "1M"),
    ("1G", "1G"),
    ("2T", "2T"),
    ("3P", "3P"),
    ("1E", "1E"),
    ("1000E", "1e21"),
    ("-1", "-1"),
    ("-1.5Gi", "-1536Mi"),
    ("-100m", "-100m"),
    (".5", "500m"),
    ("5.", "5"),
    ("007", "7"),
];

#[test]
fn canonical_forms_match_the_api_server() {
    for (input, want) in REFERENCE {
        assert_eq!(canon(input), *want, "input {input:?}");
        // Canonical forms are fixed points.
        assert_eq!(canon(want), *want, "canonical {want:?}");
    }
}

#[test]
fn integers_built_in_binary_format_print_with_binary_suffixes() {
    assert_eq!(Quantity::from_bytes(4_294_967_296).to_string(), "4Gi");
    assert_eq!(Quantity::from_bytes(16_106_127_360).to_string(), "15Gi");
    assert_eq!(Quantity::from_bytes(1_048_576).to_string(), "1Mi");
    assert_eq!(Quantity::from_bytes(1000).to_string(), "1k");
    assert_eq!(Quantity::from_int(100, Format::BinarySI).to_string(), "100");
    assert_eq!(Quantity::from_int(1536, Format::BinarySI).to_string(), "1536");
    assert_eq!(Quantity::from_int(2048, Format::BinarySI).to_string(), "2Ki");
}

#[test]
fn invalid_inputs_are_refused_with_the_input_quoted() {
    for bad in ["", "Gi", "1.2.3", "1K", "1gi", "1 Gi", "1e", "1e+", "1ee3", "abc", "--1", "1Gii", "."] {
        let err = Quantity::parse(bad).expect_err(bad);
        assert!(err.to_string().contains(&format!("{bad:?}")), "{bad:?}: {err}");
    }
    assert!(matches!(Quantity::parse("1e40"), Err(QuantityError::OutOfRange(_))));
    assert!(matches!(Quantity::parse("99999999999999999999999999999999999999999"), Err(QuantityError::OutOfRange(_))));
}

#[test]
fn comparison_ignores_format() {
    assert_eq!(Quantity::parse("1Gi").unwrap(), Quantity::parse("1073741824").unwrap());
    assert_eq!(Quantity::parse("1k").unwrap(), Quantity::parse("1e3").unwrap());
    assert!(Quantity::parse("1Mi").unwrap() > Quantity::parse("1M").unwrap());
}

#[test]
fn value_ceil_rounds_up_like_value() {
    assert_eq!(Quantity::parse("1500m").unwrap().value_ceil(), Some(2));
    assert_eq!(Quantity::parse("1n").unwrap().value_ceil(), Some(1));
    assert_eq!(Quantity::parse("2").unwrap().value_ceil(), Some(2));
    assert_eq!(Quantity::parse("15Gi").unwrap().as_u64_exact(), Some(16_106_127_360));
    assert_eq!(Quantity::parse("0.5").unwrap().as_u64_exact(), None);
}

#[test]
fn arithmetic_is_checked() {
    let gi = Quantity::parse("1Gi").unwrap();
    assert_eq!(gi.checked_add(gi).unwrap().to_string(), "2Gi");
    assert_eq!(gi.checked_sub(Quantity::parse("512Mi").unwrap()).unwrap().to_string(), "512Mi");
    assert_eq!(gi.checked_mul(3).unwrap().to_string(), "3Gi");
    let huge = Quantity::parse("100000000000000000000").unwrap();
    assert_eq!(huge.checked_mul(i64::MAX).unwrap_err(), QuantityError::Overflow);
    // 15Gi * 1.5, floored to whole MiB.
    let scaled = Quantity::parse("15Gi").unwrap().scale_floor(3, 2, Quantity::parse("1Mi").unwrap()).unwrap();
    assert_eq!(scaled.to_string(), "23040Mi");
}

#[test]
fn serde_uses_the_canonical_string_and_accepts_integers() {
    let q: Quantity = serde_json::from_str("\"4096Mi\"").unwrap();
    assert_eq!(serde_json::to_string(&q).unwrap(), "\"4Gi\"");
    let n: Quantity = serde_json::from_str("100").unwrap();
    assert_eq!(n.to_string(), "100");
    assert!(serde_json::from_str::<Quantity>("\"4 GiB\"").is_err());
}

fn any_format() -> impl Strategy<Value = Format> {
    prop_oneof![Just(Format::DecimalSI), Just(Format::BinarySI), Just(Format::DecimalExponent)]
}

proptest! {
    #[test]
    fn printing_then_parsing_keeps_the_value(nanos in -(1i128 << 100)..(1i128 << 100), format in any_format()) {
        let q = Quantity { nanos, format };
        let printed = q.to_string();
        let back = Quantity::parse(&printed).unwrap();
        prop_assert_eq!(back, q, "{}", printed);
        // And the canonical form is stable.
        prop_assert_eq!(back.to_string(), printed);
    }

    #[test]
    fn byte_counts_in_whole_mebibytes_print_without_loss(mib in 1u64..(1 << 24)) {
        let bytes = mib * 1024 * 1024;
        let printed = Quantity::from_bytes(bytes).to_string();
        prop_assert!(printed.ends_with("Mi") || printed.ends_with("Gi") || printed.ends_with("Ti"), "{}", printed);
        prop_assert_eq!(Quantity::parse(&printed).unwrap().as_u64_exact(), Some(bytes));
    }

    #[test]
    fn parsing_scales_exactly(whole in 0u32..100_000, suffix in prop::sample::select(vec![("Ki", 1u64 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30), ("k", 1000), ("M", 1_000_000), ("", 1)])) {
        let q = Quantity::parse(&format!("{whole}{}", suffix.0)).unwrap();
        prop_assert_eq!(q.as_u64_exact(), Some(u64::from(whole) * suffix.1));
    }

    #[test]
    fn addition_matches_integer_addition(a in 0u64..(1 << 50), b in 0u64..(1 << 50)) {
        let sum = Quantity::from_bytes(a).checked_add(Quantity::from_bytes(b)).unwrap();
        prop_assert_eq!(sum.as_u64_exact(), Some(a + b));
    }
}
