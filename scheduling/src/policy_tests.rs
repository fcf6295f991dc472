use proptest::prelude::*;

use super::*;

fn q(s: &str) -> Quantity {
    Quantity::parse(s).unwrap()
}

fn range(value: &str, default: &str, min: &str, max: &str, step: &str) -> Capacity {
    Capacity {
        value: q(value),
        policy: Some(RequestPolicy {
            default: Some(q(default)),
            valid: ValidRequests::Range { min: q(min), max: Some(q(max)), step: Some(q(step)) },
        }),
    }
}

fn consumed(cap: &Capacity, request: Option<&str>) -> Result<String, PolicyError> {
    cap.consumed_by(request.map(q)).map(|c| c.to_string())
}

#[test]
fn memory_requests_round_up_to_whole_mebibytes_from_the_minimum() {
    let memory = range("24Gi", "24Gi", "1Mi", "24Gi", "1Mi");
    let cases = [
        (None, "24Gi"),
        (Some("1000Mi"), "1000Mi"),
        (Some("4095Mi"), "4095Mi"),
        (Some("4Gi"), "4Gi"),
        (Some("1"), "1Mi"),
        (Some("1Ki"), "1Mi"),
        (Some("1.5Mi"), "2Mi"),
        (Some("1G"), "954Mi"),
        (Some("24Gi"), "24Gi"),
    ];
    for (request, want) in cases {
        assert_eq!(consumed(&memory, request).unwrap(), want, "request {request:?}");
    }
    assert!(matches!(memory.consumed_by(Some(q("24577Mi"))), Err(PolicyError::AboveMax { .. })));
}

#[test]
fn core_requests_follow_the_zero_to_hundred_grid() {
    let cores = range("100", "100", "0", "100", "1");
    for (request, want) in
        [(None, "100"), (Some("0"), "0"), (Some("3"), "3"), (Some("50"), "50"), (Some("500m"), "1"), (Some("99.1"), "100")]
    {
        assert_eq!(consumed(&cores, request).unwrap(), want, "request {request:?}");
    }
    let err = cores.consumed_by(Some(q("101"))).unwrap_err();
    assert_eq!(err.to_string(), "101 is above the maximum 100");
}

#[test]
fn valid_values_take_the_next_larger_value_or_do_not_fit() {
    let cap = Capacity {
        value: q("8"),
        policy: Some(RequestPolicy { default: Some(q("2")), valid: ValidRequests::Values(vec![q("1"), q("2"), q("4"), q("8")]) }),
    };
    assert_eq!(consumed(&cap, None).unwrap(), "2");
    assert_eq!(consumed(&cap, Some("3")).unwrap(), "4");
    assert_eq!(consumed(&cap, Some("500m")).unwrap(), "1");
    assert_eq!(cap.consumed_by(Some(q("9"))).unwrap_err(), PolicyError::NotAllowed(q("9")));
}

#[test]
fn without_a_policy_a_request_is_taken_as_is_and_no_request_takes_all() {
    let cap = Capacity { value: q("10"), policy: None };
    assert_eq!(consumed(&cap, None).unwrap(), "10");
    assert_eq!(consumed(&cap, Some("3500m")).unwrap(), "3500m");
}

#[test]
fn a_range_without_step_raises_to_min_only() {
    let cap = Capacity {
        value: q("10"),
        policy: Some(RequestPolicy { default: None, valid: ValidRequests::Range { min: q("2"), max: None, step: None } }),
    };
    assert_eq!(consumed(&cap, Some("1")).unwrap(), "2");
    assert_eq!(consumed(&cap, Some("2500m")).unwrap(), "2500m");
    assert_eq!(consumed(&cap, None).unwrap(), "10");
}

proptest! {
    #[test]
    fn stepped_results_are_on_the_grid_and_never_below_the_request(
        min in 0i64..1000, step in 1i64..5000, request in 0i64..10_000_000,
    ) {
        let cap = Capacity {
            value: Quantity::from_int(i64::MAX / 4, Format::DecimalSI),
            policy: Some(RequestPolicy { default: None, valid: ValidRequests::Range {
                min: Quantity::from_int(min, Format::DecimalSI), max: None, step: Some(Quantity::from_int(step, Format::DecimalSI)) } }),
        };
        let got = cap.consumed_by(Some(Quantity::from_int(request, Format::DecimalSI))).unwrap().value_ceil().unwrap();
        prop_assert!(got >= request.max(min));
        prop_assert_eq!((got - min) % step, 0);
        prop_assert!(got - request.max(min) < step);
    }
}

/// Kubernetes 1.38 (`DRAFractionalCapacityRange`, GA): on a grid of thousandths the scheduler
/// rounds in thousandths, so fractional core requests consume what they ask; whole grids, and
/// memory's mebibyte grid, round as before. Figures from the allocator's `roundUpRange` at
/// v0.38.0-beta.0, and checked against that scheduler by the rounding test.
#[test]
fn fractional_rounding_keeps_thousandths_on_a_milli_grid() {
    let cores = range("100", "100", "1m", "100", "1m");
    let milli = |r: &str| cores.consumed_by_in(Some(q(r)), Rounding::Milli).unwrap().to_string();
    let whole = |r: &str| cores.consumed_by_in(Some(q(r)), Rounding::Whole).unwrap().to_string();
    for (request, in_milli, in_whole) in [
        ("500m", "500m", "1"),
        ("99.1", "99100m", "100"),
        ("1500m", "1500m", "2"),
        ("0.1", "100m", "1"),
        ("0", "1m", "1m"),
        ("30", "30", "30"),
    ] {
        assert_eq!((milli(request), whole(request)), (in_milli.to_owned(), in_whole.to_owned()), "request {request}");
    }
    // Below a thousandth the scheduler cannot represent the request: no fit, never a wrap.
    assert!(cores.consumed_by_in(Some(q("1500u")), Rounding::Milli).is_err());
    let memory = range("24Gi", "24Gi", "1Mi", "24Gi", "1Mi");
    for request in ["1.5Mi", "1G", "1", "4095Mi"] {
        assert_eq!(
            memory.consumed_by_in(Some(q(request)), Rounding::Milli).unwrap(),
            memory.consumed_by(Some(q(request))).unwrap(),
            "request {request}"
        );
    }
    assert_eq!((Rounding::of_release(37), Rounding::of_release(38)), (Rounding::Whole, Rounding::Milli));
}

proptest! {
    /// Whichever way it rounds, a request on a milli grid consumes at least what it asks, less
    /// than a step more, and an amount on the grid.
    #[test]
    fn milli_rounding_never_takes_less_than_asked(request in 0i64..200_000, step in 1i64..5000) {
        let cores = range("200", "200", "1m", "200", &format!("{step}m"));
        if let Ok(c) = cores.consumed_by_in(Some(Quantity::from_milli(request)), Rounding::Milli) {
            let c = c.nanos() / 1_000_000;
            prop_assert!(c >= i128::from(request).max(1));
            prop_assert!(c - i128::from(request.max(1)) < i128::from(step));
            prop_assert_eq!((c - 1) % i128::from(step), 0);
        }
    }
}
