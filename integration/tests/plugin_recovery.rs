//! The kubelet plugin under stress: SIGKILL between any two steps of prepare or unprepare and at
//! random moments of many calls in flight, and 100 concurrent prepares of shares that together
//! over-commit a card.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{
    Dirs, NODE, PREPARE_FAIL_POINTS, claim_holder, claim_response, claim_with, driver, driver_with, hand_allocated_claim,
    kubelet, wait_dead,
};
use serde_json::Value;
use vgpu_dra_integration::ControlPlane;

fn ok(reply: &Value, uid: &str) -> bool {
    reply.get("error").is_none() && claim_response(reply, uid).get("error").is_none_or(|e| e.as_str() == Some(""))
}

#[test]
fn sigkill_between_any_two_steps_recovers_to_what_the_kubelet_last_asked() {
    let mut plane = ControlPlane::start().expect("control plane");
    plane.create_node(NODE).unwrap();
    let kubectl = plane.kubectl().clone();
    let dirs = Dirs::new(plane.dir());
    std::fs::create_dir_all(dirs.kubelet.join("plugins_registry")).unwrap();
    kubectl.apply(&claim_with("c1", "4Gi", "50")).unwrap();
    // A first driver publishes the slice the scheduler allocates from.
    let mut publisher = driver(&plane, &dirs, "driver-publish");
    plane.wait_allocated("default", "c1", Duration::from_secs(30)).unwrap();
    publisher.stop();
    let uid = kubectl.run(&["get", "resourceclaim", "c1", "-o", "jsonpath={.metadata.uid}"]).unwrap();
    let claim = [("default", "c1", uid.as_str())];

    for point in PREPARE_FAIL_POINTS {
        let mut dying = driver_with(&plane, &dirs, &format!("driver-{point}"), &[&format!("--fail-point={point}")]);
        let mut k = kubelet(&dirs);
        let reply = k.prepare(&claim).unwrap();
        assert!(!ok(&reply, &uid), "{point}: the call should have died with the plugin: {reply}");
        wait_dead(&mut dying);
        drop(k);
        if point == "prepare-staged" {
            assert_eq!(dirs.written_temp_files().len(), 2, "{point}: the record and the spec are written unseen");
            assert_eq!(dirs.specs_for(&uid), 0, "{point}");
            assert!(dirs.checkpointed().is_empty(), "{point}");
        }
        let crashed = dirs.temp_files();
        // The kubelet retries the prepare against the restarted plugin.
        let mut drv = driver(&plane, &dirs, &format!("driver-after-{point}"));
        let mut k = kubelet(&dirs);
        let reply = k.prepare(&claim).unwrap();
        assert!(ok(&reply, &uid), "{point}: {reply}");
        assert_eq!(dirs.specs_for(&uid), 1, "{point}");
        assert_eq!(dirs.checkpointed(), std::slice::from_ref(&uid), "{point}");
        let left: Vec<String> = dirs.temp_files().into_iter().filter(|f| crashed.contains(f)).collect();
        assert_eq!(left, Vec::<String>::new(), "{point}: a crash's temp files are removed at start");
        assert_eq!(dirs.written_temp_files(), Vec::<String>::new(), "{point}: nothing staged is left");
        // Back to unprepared for the next round.
        assert!(ok(&k.unprepare(&claim).unwrap(), &uid));
        assert_eq!(dirs.specs_for(&uid), 0, "{point}");
        drv.stop();
    }

    for point in ["unprepare-checkpointed", "unprepare-spec-removed"] {
        let mut drv = driver(&plane, &dirs, &format!("driver-before-{point}"));
        let mut k = kubelet(&dirs);
        assert!(ok(&k.prepare(&claim).unwrap(), &uid));
        drv.stop();
        drop(k);
        let mut dying = driver_with(&plane, &dirs, &format!("driver-{point}"), &[&format!("--fail-point={point}")]);
        let mut k = kubelet(&dirs);
        let reply = k.unprepare(&claim).unwrap();
        assert!(!ok(&reply, &uid), "{point}: {reply}");
        wait_dead(&mut dying);
        drop(k);
        let mut drv = driver(&plane, &dirs, &format!("driver-after-{point}"));
        let mut k = kubelet(&dirs);
        // Restart alone already leaves no spec of a claim the checkpoint no longer holds.
        assert_eq!(dirs.specs_for(&uid), 0, "{point}: leaked spec");
        assert!(ok(&k.unprepare(&claim).unwrap(), &uid), "{point}");
        assert!(dirs.checkpointed().is_empty(), "{point}");
        // The ledger released the share: the whole card can be prepared again.
        assert!(ok(&k.prepare(&claim).unwrap(), &uid), "{point}");
        assert!(ok(&k.unprepare(&claim).unwrap(), &uid), "{point}");
        drv.stop();
    }
}

/// A small xorshift generator: the test's choices, reproducible from the seed it prints.
struct Dice(u64);

impl Dice {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// 200 kubelet calls, each a batch of prepares or of unprepares of a random few of ten claims
/// (prepared concurrently by the plugin), with the driver killed by SIGKILL at five random
/// moments: after each restart the kubelet retries the call that failed, and then what is on
/// disk is exactly what the kubelet last asked, whatever the kill interrupted. At the end every
/// claim is unprepared and all ten fit on the card again: no share was leaked or lost.
/// `VGPU_DRA_SEED` replays a run.
#[test]
fn sigkill_at_random_moments_of_200_calls_converges_to_what_the_kubelet_last_asked() {
    const CALLS: u64 = 200;
    let seed = std::env::var("VGPU_DRA_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1);
    eprintln!("VGPU_DRA_SEED={seed}");
    let mut dice = Dice(seed);
    // Ten claims of 10 cores and one share each: together exactly what the card has.
    let (plane, dirs, uids) = hand_allocated_on_one_card(10);
    let mut kills: Vec<u64> = Vec::new();
    while kills.len() < 5 {
        let at = dice.below(CALLS);
        if !kills.contains(&at) {
            kills.push(at);
        }
    }
    // What the kubelet last asked: the claims it holds prepared.
    let mut want = std::collections::BTreeSet::<String>::new();
    let mut drv = driver(&plane, &dirs, "driver-0");
    let mut k = kubelet(&dirs);
    let converged = |want: &std::collections::BTreeSet<String>, when: &str| {
        let mut expected: Vec<String> = want.iter().cloned().collect();
        expected.sort();
        assert_eq!(dirs.checkpointed(), expected, "records {when} (VGPU_DRA_SEED={seed})");
        for (_, uid) in &uids {
            assert_eq!(dirs.specs_for(uid), usize::from(want.contains(uid)), "spec of {uid} {when} (VGPU_DRA_SEED={seed})");
        }
        assert_eq!(dirs.written_temp_files(), Vec::<String>::new(), "nothing staged is left {when} (VGPU_DRA_SEED={seed})");
    };
    for call in 0..CALLS {
        let prepare = dice.below(2) == 0;
        let mut batch: Vec<(&str, &str, &str)> =
            uids.iter().filter(|_| dice.below(3) == 0).map(|(n, u)| ("default", n.as_str(), u.as_str())).collect();
        if batch.is_empty() {
            let (n, u) = &uids[dice.below(10) as usize];
            batch.push(("default", n, u));
        }
        let send = |k: &mut vgpu_dra_integration::KubeletSim| {
            if prepare { k.prepare(&batch).unwrap() } else { k.unprepare(&batch).unwrap() }
        };
        let reply = if kills.contains(&call) {
            let delay = Duration::from_micros(dice.below(20_000));
            let reply = std::thread::scope(|s| {
                s.spawn(|| {
                    std::thread::sleep(delay);
                    drv.signal("KILL").unwrap();
                });
                send(&mut k)
            });
            wait_dead(&mut drv);
            drop(k);
            drv = driver(&plane, &dirs, &format!("driver-{call}"));
            k = kubelet(&dirs);
            let interrupted = !all_ok(&reply, &batch);
            eprintln!("call {call}: killed after {delay:?}, {}", if interrupted { "during the call" } else { "after it" });
            if !interrupted {
                reply
            } else {
                // The kubelet retries a call that failed until it succeeds.
                send(&mut k)
            }
        } else {
            send(&mut k)
        };
        assert!(
            all_ok(&reply, &batch),
            "call {call} ({}): {reply} (VGPU_DRA_SEED={seed})",
            if prepare { "prepare" } else { "unprepare" }
        );
        for (_, _, uid) in &batch {
            if prepare {
                want.insert((*uid).to_owned());
            } else {
                want.remove(*uid);
            }
        }
        if kills.contains(&call) {
            converged(&want, &format!("after the kill at call {call}"));
        }
    }
    converged(&want, "after the last call");
    let all: Vec<(&str, &str, &str)> = uids.iter().map(|(n, u)| ("default", n.as_str(), u.as_str())).collect();
    assert!(all_ok(&k.unprepare(&all).unwrap(), &all), "VGPU_DRA_SEED={seed}");
    converged(&std::collections::BTreeSet::new(), "after unpreparing all");
    let reply = k.prepare(&all).unwrap();
    assert!(all_ok(&reply, &all), "all ten fit again: {reply} (VGPU_DRA_SEED={seed})");
    drv.stop();
}

/// Whether every claim of a call succeeded.
fn all_ok(reply: &Value, claims: &[(&str, &str, &str)]) -> bool {
    claims.iter().all(|(_, _, uid)| ok(reply, uid))
}

/// A control plane with `n` claims `o0`... allocated by hand to the one card of [`NODE`], 10 cores
/// and one share each, and the directories of a driver there; the claims' names and UIDs.
fn hand_allocated_on_one_card(n: u32) -> (ControlPlane, Dirs, Vec<(String, String)>) {
    let plane = ControlPlane::start().expect("control plane");
    plane.create_node(NODE).unwrap();
    let kubectl = plane.kubectl().clone();
    kubectl.apply(&claim_with("unused", "1Gi", "1")).unwrap(); // the DeviceClass
    let dirs = Dirs::new(plane.dir());
    std::fs::create_dir_all(dirs.kubelet.join("plugins_registry")).unwrap();
    let (claims, statuses) = overcommitted_claims(n, &claim_holder(&kubectl, "default"));
    kubectl.run_with_input(&["create", "-f", "-"], Some(&claims)).unwrap();
    kubectl.run_with_input(&["replace", "--subresource=status", "-f", "-"], Some(&statuses)).unwrap();
    let uids = (0..n)
        .map(|i| {
            let name = format!("o{i}");
            let uid = kubectl.run(&["get", "resourceclaim", &name, "-o", "jsonpath={.metadata.uid}"]).unwrap();
            (name, uid)
        })
        .collect();
    (plane, dirs, uids)
}

/// Claims with hand-written allocations (as a buggy or racing scheduler might write them) that
/// together ask 10x what the card has.
fn overcommitted_claims(n: u32, holder: &str) -> (String, String) {
    let mut claims = String::new();
    let mut statuses = String::new();
    for i in 0..n {
        let (claim, status) = hand_allocated_claim("default", &format!("o{i}"), i + 1, "1Gi", holder);
        claims.push_str(&(claim + "---\n"));
        statuses.push_str(&(status + "---\n"));
    }
    (claims, statuses)
}

#[test]
fn a_hundred_concurrent_prepares_never_overcommit_a_card() {
    let (plane, dirs, uids) = hand_allocated_on_one_card(100);
    let _drv = driver(&plane, &dirs, "driver");
    let mut k = kubelet(&dirs);
    let batch: Vec<(&str, &str, &str)> = uids.iter().map(|(n, u)| ("default", n.as_str(), u.as_str())).collect();
    // One kubelet call: the plugin prepares the 100 claims concurrently.
    let reply = k.prepare(&batch).unwrap();
    let admitted = uids.iter().filter(|(_, u)| ok(&reply, u)).count();
    let refused: Vec<String> = uids
        .iter()
        .filter(|(_, u)| !ok(&reply, u))
        .map(|(_, u)| claim_response(&reply, u)["error"].as_str().unwrap_or_default().to_owned())
        .collect();
    // 100 cores and 10 shares: exactly ten 10-core shares fit.
    assert_eq!(admitted, 10, "{reply}");
    assert!(refused.iter().all(|e| e.contains("device hami-gpu-0") && e.contains("free")), "{refused:?}");
    assert_eq!(dirs.checkpointed().len(), 10);
}
