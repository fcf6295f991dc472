#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::*;
use crate::discovery::mock::{MockSource, parse_spec};

/// Two mock cards whose reads can be made to hang or fail one by one.
#[derive(Default)]
struct Fake {
    hang: [AtomicBool; 2],
    fail: [AtomicBool; 2],
    reads: [AtomicUsize; 2],
    list_fails: AtomicBool,
}

impl Fake {
    fn reads(&self, index: usize) -> usize {
        self.reads[index].load(Ordering::SeqCst)
    }
}

impl DeviceSource for Fake {
    fn inventory(&self) -> Result<Inventory, DiscoveryError> {
        MockSource::new("n1", parse_spec("2xTesla T4:15Gi").unwrap()).inventory()
    }

    fn cards(&self) -> Result<CardList, DiscoveryError> {
        if self.list_fails.load(Ordering::SeqCst) {
            return Err(DiscoveryError::NvmlUnavailable("driver unloaded".into()));
        }
        Ok(CardList { driver_version: "550".into(), cuda_driver_version: (12, 4), indices: vec![0, 1] })
    }

    fn card(&self, index: u32) -> Result<Gpu, DiscoveryError> {
        let i = index as usize;
        self.reads[i].fetch_add(1, Ordering::SeqCst);
        while self.hang[i].load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        if self.fail[i].load(Ordering::SeqCst) {
            return Err(DiscoveryError::Nvml { what: "memory info", reason: "Unknown Error".into() });
        }
        Ok(self.inventory()?.gpus.swap_remove(i))
    }
}

const DEADLINE: Duration = Duration::from_millis(150);

fn health(inventory: &Inventory) -> Vec<Health> {
    inventory.gpus.iter().map(|g| g.health).collect()
}

#[test]
fn a_hung_card_is_unhealthy_within_the_deadline_and_the_other_is_read_every_round() {
    let fake = Arc::new(Fake::default());
    let mut reader = Reader::new(fake.clone(), DEADLINE);
    let first = reader.round().unwrap();
    assert_eq!(health(&first), [Health::Healthy, Health::Healthy]);

    fake.hang[1].store(true, Ordering::SeqCst);
    let started = Instant::now();
    let second = reader.round().unwrap();
    let took = started.elapsed();
    assert!(took >= DEADLINE && took < DEADLINE * 3, "a round with a hung card lasts about one deadline: {took:?}");
    assert_eq!(health(&second), [Health::Healthy, Health::Unhealthy]);
    assert_eq!(second.gpus[1].uuid, first.gpus[1].uuid, "the hung card keeps its last known details");
    assert_eq!(second.gpus[1].memory_bytes, first.gpus[1].memory_bytes);

    let third = reader.round().unwrap();
    assert_eq!(health(&third), [Health::Healthy, Health::Unhealthy]);
    assert_eq!(fake.reads(0), 3, "card 0 is read every round");
    assert_eq!(fake.reads(1), 2, "card 1 is not asked again while its call hangs");

    fake.hang[1].store(false, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(30));
    let fourth = reader.round().unwrap();
    assert_eq!(health(&fourth), [Health::Healthy, Health::Healthy], "recovers once the call returns");
    assert_eq!(fake.reads(1), 3);
}

#[test]
fn a_failing_card_is_unhealthy_and_one_never_read_is_left_out() {
    let fake = Arc::new(Fake::default());
    fake.fail[1].store(true, Ordering::SeqCst);
    let mut reader = Reader::new(fake.clone(), DEADLINE);
    let first = reader.round().unwrap();
    assert_eq!(first.gpus.len(), 1, "no details to publish card 1 with");
    fake.fail[1].store(false, Ordering::SeqCst);
    assert_eq!(health(&reader.round().unwrap()), [Health::Healthy, Health::Healthy]);
    fake.fail[0].store(true, Ordering::SeqCst);
    let failed = reader.round().unwrap();
    assert_eq!(health(&failed), [Health::Unhealthy, Health::Healthy]);
    assert_eq!(failed.gpus[0].index, 0);
}

#[test]
fn a_card_list_that_cannot_be_read_marks_every_card_unhealthy() {
    let fake = Arc::new(Fake::default());
    fake.list_fails.store(true, Ordering::SeqCst);
    let mut reader = Reader::new(fake.clone(), DEADLINE);
    assert!(reader.round().is_none(), "nothing known yet");
    fake.list_fails.store(false, Ordering::SeqCst);
    assert_eq!(health(&reader.round().unwrap()), [Health::Healthy, Health::Healthy]);
    fake.list_fails.store(true, Ordering::SeqCst);
    let lost = reader.round().unwrap();
    assert_eq!(health(&lost), [Health::Unhealthy, Health::Unhealthy]);
    assert_eq!(lost.gpus.len(), 2);
}

fn wait_for(source: &SnapshotSource, what: &str, check: impl Fn(&Inventory) -> bool) -> Duration {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        if source.inventory().is_ok_and(|i| check(&i)) {
            return started.elapsed();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("no snapshot with {what} in 5 s");
}

#[test]
fn the_loop_publishes_snapshots_and_isolates_a_hung_card() {
    let fake = Arc::new(Fake::default());
    let poll = Duration::from_millis(20);
    let devices = DeviceLoop::start(fake.clone(), DeviceLoopOptions { poll, deadline: DEADLINE }).unwrap();
    let source = devices.source();
    let mut changes = source.subscribe();
    wait_for(&source, "both cards", |i| i.gpus.len() == 2);
    changes.mark_unchanged();

    fake.hang[1].store(true, Ordering::SeqCst);
    let took = wait_for(&source, "card 1 unhealthy", |i| health(i) == [Health::Healthy, Health::Unhealthy]);
    assert!(took < DEADLINE * 2 + poll * 2 + Duration::from_millis(200), "reported after {took:?}");
    assert!(changes.has_changed().unwrap(), "subscribers are woken by the change");
    let before = fake.reads(0);
    std::thread::sleep(DEADLINE * 3);
    assert!(fake.reads(0) >= before + 2, "card 0 keeps being read while card 1 hangs");
    assert_eq!(fake.reads(1), 2, "one read of card 1 before the hang, one hanging since");

    fake.hang[1].store(false, Ordering::SeqCst);
    wait_for(&source, "card 1 healthy again", |i| health(i) == [Health::Healthy, Health::Healthy]);
    drop(devices);
}
