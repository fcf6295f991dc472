use std::os::unix::fs::PermissionsExt;

use super::region::writer::{Process, put_i32, put_u64, region};
use super::*;
use crate::plugin::storage::checkpoint::PreparedClaim;
use crate::plugin::storage::host::create_region_file;

const CARD: &str = "GPU-00000000-0000-0000-0000-000000000001";

fn watch_of(p: &PreparedClaim) -> Option<Watched> {
    Watched::new(&p.claim, &p.spec)
}

fn prepared(uid: &str, cards: &[&str], env: &[(&str, &str)]) -> PreparedClaim {
    let mut vars = vec![
        format!("CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/claims/{uid}/{}.cache", cards[0]),
        format!("NVIDIA_VISIBLE_DEVICES={}", cards.join(",")),
    ];
    for i in 0..cards.len() {
        vars.push(format!("CUDA_DEVICE_MEMORY_LIMIT_{i}=4096m"));
    }
    vars.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    let spec = serde_json::json!({
        "cdiVersion": "0.6.0", "kind": "k8s.hami-core-gpu.project-hami.io/claim", "devices": [],
        "containerEdits": {"env": vars},
    });
    PreparedClaim {
        claim: ClaimRef::new("ns", &format!("claim-{uid}"), uid).unwrap(),
        devices: Vec::new(),
        spec: HeldSpec::new(&serde_json::from_value(spec).unwrap()),
        mig: Vec::new(),
        consumer: None,
    }
}

fn watched(uid: &str, priority: Option<&str>) -> Watched {
    let env: Vec<(&str, &str)> = priority.map(|p| ("CUDA_TASK_PRIORITY", p)).into_iter().collect();
    watch_of(&prepared(uid, &[CARD], &env)).unwrap()
}

/// A claim directory with the driver's region file, filled as a running container would.
fn running(root: &Path, w: &Watched, recent_kernel: i32) -> PathBuf {
    let dir = root.join(w.claim.uid.as_str());
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    create_region_file(&dir, &w.file).unwrap();
    let mut bytes = region(&[CARD], &[4 << 30], &[Process { pid: 7, memory: 1 << 30, sm_util: 25 }]);
    put_i32(&mut bytes, offset::RECENT_KERNEL, recent_kernel);
    let path = dir.join(&w.file);
    std::fs::write(&path, &bytes).unwrap();
    path
}

fn field(path: &Path, at: usize) -> i32 {
    let b = std::fs::read(path).unwrap();
    i32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
}

#[test]
fn a_claim_is_watched_as_its_spec_says() {
    let p = prepared("u-1", &[CARD, "GPU-b"], &[("CUDA_TASK_PRIORITY", "0"), ("GPU_CORE_UTILIZATION_POLICY", "disable")]);
    let w = watch_of(&p).unwrap();
    assert_eq!(w.file, format!("{CARD}.cache"));
    assert_eq!(w.cards, vec![CARD.to_owned(), "GPU-b".to_owned()]);
    assert_eq!(w.limits, vec![4096 << 20, 4096 << 20]);
    assert_eq!((w.priority, w.policy), (feedback::HIGH, Policy::Disable));
    // Any priority but 0 (or below) is HAMi's low one; none is HAMi-core's default, low.
    for (value, expected) in [("1", feedback::LOW), ("7", feedback::LOW), ("-3", feedback::HIGH), ("x", feedback::LOW)] {
        assert_eq!(watch_of(&prepared("u", &[CARD], &[("CUDA_TASK_PRIORITY", value)])).unwrap().priority, expected);
    }
    assert_eq!(watched("u", None).priority, feedback::LOW);
}

#[test]
fn a_high_priority_claim_blocks_a_low_one_and_a_lone_one_bursts() {
    let tmp = tempfile::tempdir().unwrap();
    let (hi, lo) = (watched("hi", Some("0")), watched("lo", Some("1")));
    let (hi_path, lo_path) = (running(tmp.path(), &hi, 2), running(tmp.path(), &lo, 2));
    let tick = feed(tmp.path(), &[hi.clone(), lo.clone()], SwitchMode::Feedback);
    assert_eq!(tick.blocked, vec![lo.claim.uid.clone()]);
    assert_eq!(field(&lo_path, offset::RECENT_KERNEL), -1);
    assert_eq!(field(&lo_path, offset::UTILIZATION_SWITCH), 1);
    assert_eq!(field(&hi_path, offset::RECENT_KERNEL), 1);
    assert_eq!(field(&hi_path, offset::UTILIZATION_SWITCH), 0, "the high one runs alone");
    // The high one stops launching: next tick the low one is released.
    let tick = feed(tmp.path(), &[hi, lo], SwitchMode::Feedback);
    assert!(tick.blocked.is_empty());
    assert_eq!(field(&lo_path, offset::RECENT_KERNEL), 0);
}

#[test]
fn strict_isolation_never_lets_a_lone_claim_burst() {
    let tmp = tempfile::tempdir().unwrap();
    let w = watched("a", None);
    let path = running(tmp.path(), &w, 2);
    let tick = feed(tmp.path(), std::slice::from_ref(&w), SwitchMode::AlwaysOn);
    assert!(tick.bursting.is_empty());
    assert_eq!(field(&path, offset::UTILIZATION_SWITCH), 1);
}

/// Everything a tenant can put where its region belongs, beside two well-behaved claims: no
/// panic, no write anywhere but the well-behaved regions, and their feedback as if alone.
#[test]
fn hostile_regions_cost_only_their_own_claim() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("claims");
    std::fs::create_dir(&root).unwrap();
    let host = tmp.path().join("etc-shadow");
    let valid = region(&[CARD], &[1], &[Process { pid: 1, memory: 1, sm_util: 1 }]);
    std::fs::write(&host, &valid).unwrap();
    let (hi, lo) = (watched("hi", Some("0")), watched("lo", None));
    let (_, lo_path) = (running(&root, &hi, 2), running(&root, &lo, 2));
    let mut hostile = Vec::new();
    let mut make = |uid: &str, put: &dyn Fn(&Path)| {
        let w = watched(uid, Some("0"));
        let dir = root.join(uid);
        std::fs::create_dir_all(&dir).unwrap();
        put(&dir.join(&w.file));
        hostile.push(w);
    };
    make("link", &|p| std::os::unix::fs::symlink(&host, p).unwrap());
    make("fifo", &|p| {
        rustix::fs::mknodat(rustix::fs::CWD, p, rustix::fs::FileType::Fifo, rustix::fs::Mode::from_raw_mode(0o666), 0).unwrap()
    });
    make("truncated", &|p| std::fs::write(p, &valid[..offset::HEAD_LEN + 3]).unwrap());
    make("sparse", &|p| std::fs::File::create(p).unwrap().set_len(10 << 30).unwrap());
    make("counts", &|p| {
        let mut b = valid.clone();
        put_u64(&mut b, offset::DEVICE_NUM, 1 << 40);
        std::fs::write(p, b).unwrap();
    });
    make("procs", &|p| {
        let mut b = valid.clone();
        put_i32(&mut b, offset::PROC_NUM, i32::MAX);
        std::fs::write(p, b).unwrap();
    });
    make("priority7", &|p| {
        let mut b = valid.clone();
        put_i32(&mut b, offset::PRIORITY, 7);
        put_i32(&mut b, offset::RECENT_KERNEL, 2);
        std::fs::write(p, b).unwrap();
    });
    let mut all = vec![hi.clone(), lo.clone()];
    all.extend(hostile.iter().cloned());
    let tick = feed(&root, &all, SwitchMode::Feedback);
    let reasons: Vec<String> = tick
        .outcomes
        .iter()
        .map(|o| match o {
            Outcome::Read(_) => "read".to_owned(),
            Outcome::Skipped(e) => e.reason().to_owned(),
        })
        .collect();
    assert_eq!(reasons, ["read", "read", "not_regular", "not_regular", "truncated", "uninitialised", "count", "count", "read"]);
    // The file written by someone else (priority 7 inside, created by the test, owned by us
    // here) still counts with the claim's priority 0: it is active and high, so it blocks too.
    assert_eq!(tick.blocked, vec![lo.claim.uid.clone()]);
    assert_eq!(field(&lo_path, offset::RECENT_KERNEL), -1);
    assert_eq!(std::fs::read(&host).unwrap(), valid, "a host file was written through a link");
    assert_eq!(std::fs::metadata(root.join("sparse").join(&hostile[3].file)).unwrap().len(), 10 << 30);
}

#[test]
fn a_region_swapped_for_a_file_of_another_user_gets_no_writes() {
    if !rustix::process::geteuid().is_root() {
        return; // Only root can give a file to another user; CI runs as root.
    }
    let tmp = tempfile::tempdir().unwrap();
    let (hi, lo) = (watched("hi", Some("0")), watched("lo", None));
    running(tmp.path(), &hi, 2);
    let lo_path = running(tmp.path(), &lo, 2);
    // The tenant removes the driver's file and puts its own in its place.
    let bytes = std::fs::read(&lo_path).unwrap();
    std::fs::remove_file(&lo_path).unwrap();
    std::fs::write(&lo_path, &bytes).unwrap();
    rustix::fs::chown(&lo_path, Some(rustix::fs::Uid::from_raw(65534)), None).unwrap();
    let tick = feed(tmp.path(), &[hi, lo.clone()], SwitchMode::Feedback);
    assert_eq!(tick.foreign, vec![lo.claim.uid.clone()]);
    assert_eq!(std::fs::read(&lo_path).unwrap(), bytes);
}
