use super::*;
use crate::compat::fixtures::{annotations, cel_skeleton, read_cel_literal};

const DRIVER: &str = "hami-core-gpu.project-hami.io";

#[test]
fn lists_are_trimmed_types_lowercased_and_empty_means_no_constraint() {
    let s = Selection::from_annotations(&annotations(&[
        (ANNOTATION_USE_TYPE, " A100, v100 ,,"),
        (ANNOTATION_NOUSE_TYPE, ""),
        (ANNOTATION_USE_UUID, "GPU-AbC , GPU-2"),
        (ANNOTATION_NOUSE_UUID, " , "),
    ]));
    assert_eq!(s.use_types, ["a100", "v100"]);
    assert!(s.nouse_types.is_empty());
    // UUIDs match exactly: case is kept.
    assert_eq!(s.use_uuids, ["GPU-AbC", "GPU-2"]);
    assert!(s.nouse_uuids.is_empty());
    assert_eq!(s.selectors(DRIVER).len(), 2);
    assert!(Selection::from_annotations(&annotations(&[(ANNOTATION_USE_TYPE, "")])).selectors(DRIVER).is_empty());
}

#[test]
fn type_rule_is_hamis_case_insensitive_substring_of_nvidia_dash_model() {
    let s = |use_: &str, nouse: &str| {
        let mut pairs = vec![];
        if !use_.is_empty() {
            pairs.push((ANNOTATION_USE_TYPE, use_));
        }
        if !nouse.is_empty() {
            pairs.push((ANNOTATION_NOUSE_TYPE, nouse));
        }
        Selection::from_annotations(&annotations(&pairs))
    };
    let cases = [
        ("A100,V100", "", "NVIDIA A100-SXM4-80GB", true),
        ("A100,V100", "", "Tesla V100-PCIE-32GB", true),
        ("A100,V100", "", "Tesla T4", false),
        ("t4", "", "Tesla T4", true),
        // HAMi's type is NVIDIA-<model>, so the prefix matches every card.
        ("NVIDIA-Tesla", "", "Tesla T4", true),
        ("", "a100", "NVIDIA A100-SXM4-80GB", false),
        ("", "a100", "Tesla T4", true),
        ("NVIDIA", "T4", "Tesla T4", false),
        ("", "", "anything", true),
    ];
    for (use_, nouse, model, want) in cases {
        assert_eq!(s(use_, nouse).allows_model(model), want, "use {use_:?} nouse {nouse:?} model {model:?}");
    }
}

#[test]
fn selectors_are_exact_cel() {
    let s = Selection::from_annotations(&annotations(&[
        (ANNOTATION_USE_TYPE, "A100"),
        (ANNOTATION_NOUSE_TYPE, "pcie"),
        (ANNOTATION_USE_UUID, "GPU-1,GPU-2"),
        (ANNOTATION_NOUSE_UUID, "GPU-3"),
    ]));
    let a = r#"device.attributes["hami-core-gpu.project-hami.io"]"#;
    assert_eq!(
        s.selectors(DRIVER),
        [
            format!(r#"has({a}.productName) && ["a100"].exists(t, ("nvidia-" + {a}.productName).lowerAscii().contains(t))"#),
            format!(r#"!(has({a}.productName) && ["pcie"].exists(t, ("nvidia-" + {a}.productName).lowerAscii().contains(t)))"#),
            format!(r#"has({a}.uuid) && {a}.uuid in ["GPU-1", "GPU-2"]"#),
            format!(r#"!(has({a}.uuid) && {a}.uuid in ["GPU-3"])"#),
        ]
    );
}

#[test]
fn cel_string_round_trips_hostile_text_as_one_literal() {
    let hostile = [
        "plain",
        r#"a"b"#,
        r"a\",
        r#"\""#,
        r#"A100"] || true || ["x"#,
        "new\nline\r\ttab\0nul",
        "unicode \u{e9} \u{202e}bidi \u{1f600}",
        "",
    ];
    for text in hostile {
        let lit = cel_string(text);
        let (decoded, len) = read_cel_literal(&lit);
        assert_eq!(decoded, text);
        assert_eq!(len, lit.len(), "{text:?} must be exactly one literal: {lit}");
        assert!(lit.bytes().all(|b| (0x20..0x7f).contains(&b)), "only printable ASCII: {lit}");
    }
}

#[test]
fn hostile_annotations_neither_break_nor_widen_the_selectors() {
    let benign = Selection::from_annotations(&annotations(&[
        (ANNOTATION_USE_TYPE, "x"),
        (ANNOTATION_NOUSE_TYPE, "x"),
        (ANNOTATION_USE_UUID, "x"),
        (ANNOTATION_NOUSE_UUID, "x"),
    ]));
    let attack = r#"x"] || true || [""#;
    let backslash = r#"x\"#;
    let hostile = Selection::from_annotations(&annotations(&[
        (ANNOTATION_USE_TYPE, attack),
        (ANNOTATION_NOUSE_TYPE, backslash),
        (ANNOTATION_USE_UUID, "GPU-1\") || (true"),
        (ANNOTATION_NOUSE_UUID, "\\\"\n"),
    ]));
    for (b, h) in benign.selectors(DRIVER).iter().zip(hostile.selectors(DRIVER)) {
        let (shape_b, _) = cel_skeleton(b);
        let (shape_h, literals) = cel_skeleton(&h);
        assert_eq!(shape_b, shape_h, "a hostile value changed the expression: {h}");
        assert!(
            literals.iter().any(|l| l == &attack.to_ascii_lowercase() || l == backslash || l.starts_with("GPU-1") || l == "\\\"")
        );
    }
}

#[test]
fn annotations_without_dra_meaning_warn() {
    let w = annotation_warnings(&annotations(&[
        ("hami.io/gpu-scheduler-policy", "binpack"),
        ("hami.io/node-scheduler-policy", "spread"),
        ("nvidia.com/vgpu-mode", "hami-core"),
        ("nvidia.com/use-gputype", "A100"),
    ]));
    // vgpu-mode has a meaning now (mig.rs): no warning.
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].starts_with("annotation hami.io/gpu-scheduler-policy is ignored: "));
    assert!(w[1].starts_with("annotation hami.io/node-scheduler-policy is ignored: "));
    assert!(annotation_warnings(&annotations(&[("other", "x")])).is_empty());
}
