//! HAMi's feedback rules, as its node monitor applies them every tick (Project-HAMi/HAMi
//! `cmd/vGPUmonitor/feedback.go`: `Observe`, `CheckBlocking`, `CheckPriority`):
//!
//! 1. Each region whose `recent_kernel` is positive has it counted down by one; if it is still
//!    positive, the region is *active* on each of its cards at its priority. HAMi-core sets it to
//!    2 at every kernel launch, so active means "launched since the previous tick".
//! 2. A region is *blocked* (`recent_kernel = -1`, which makes HAMi-core's launches wait) while a
//!    region of a higher priority (a lower number) is active on the first of its cards that has
//!    any active region; otherwise a blocked region is released (`recent_kernel = 0`).
//! 3. A region is throttled to its SM limit (`utilization_switch = 1`) while a region of a higher
//!    priority, or another of its own priority, is active on any of its cards; otherwise it may
//!    use the idle card (`utilization_switch = 0`).
//!
//! Two departures, both for safety: the priority and the cards come from the claim as the driver
//! prepared it, never from the file (HAMi indexes a two-element array with the file's priority, so
//! a tenant writing 7 crashes its monitor); and priorities other than 0 fold onto 1, the two
//! levels HAMi knows.

use std::collections::BTreeMap;

/// The highest priority, HAMi's `nvidia.com/priority: 0`.
pub const HIGH: u8 = 0;
/// The default priority (HAMi-core's when `CUDA_TASK_PRIORITY` is unset).
pub const LOW: u8 = 1;

/// How the monitor sets `utilization_switch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SwitchMode {
    /// HAMi's rule 3: throttle only under contention.
    #[default]
    Feedback,
    /// Always throttle to the SM limit (strict isolation: a pod never runs faster than its share).
    AlwaysOn,
}

/// The claim's `GPU_CORE_UTILIZATION_POLICY`: `force` and `disable` make HAMi-core ignore the
/// switch, so the monitor leaves it alone for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Follows the switch.
    #[default]
    Default,
    /// Always throttled.
    Force,
    /// Never throttled.
    Disable,
}

impl Policy {
    /// The policy a `GPU_CORE_UTILIZATION_POLICY` value names (HAMi-core accepts both cases).
    pub fn from_env(value: &str) -> Self {
        match value {
            "force" | "FORCE" => Self::Force,
            "disable" | "DISABLE" => Self::Disable,
            _ => Self::Default,
        }
    }
}

/// One region as this tick found it, with the claim's trusted settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen<K> {
    /// Whose region.
    pub key: K,
    /// The claim's cards (uuids), in the claim's order.
    pub cards: Vec<String>,
    /// The claim's priority, [`HIGH`] or [`LOW`].
    pub priority: u8,
    /// The claim's policy.
    pub policy: Policy,
    /// `recent_kernel` as read.
    pub recent_kernel: i32,
    /// `utilization_switch` as read.
    pub utilization_switch: i32,
}

/// What to write into one region; `None` leaves a field as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Writes {
    /// New `recent_kernel`.
    pub recent_kernel: Option<i32>,
    /// New `utilization_switch`.
    pub utilization_switch: Option<i32>,
}

impl Writes {
    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        self.recent_kernel.is_none() && self.utilization_switch.is_none()
    }
}

/// The outcome for one region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision<K> {
    /// Whose region.
    pub key: K,
    /// What to write.
    pub writes: Writes,
    /// Launches wait after this tick.
    pub blocked: bool,
    /// Throttled to the SM limit after this tick.
    pub throttled: bool,
}

/// Active regions per card and priority.
type Active = BTreeMap<String, [u32; 2]>;

/// Applies one tick of HAMi's rules to every region of the node at once.
pub fn tick<K: Clone>(seen: &[Seen<K>], mode: SwitchMode) -> Vec<Decision<K>> {
    let mut active = Active::new();
    let counted: Vec<i32> = seen
        .iter()
        .map(|s| {
            if s.recent_kernel <= 0 {
                return s.recent_kernel;
            }
            let left = s.recent_kernel - 1;
            if left > 0 {
                for card in &s.cards {
                    active.entry(card.clone()).or_default()[usize::from(s.priority.min(LOW))] += 1;
                }
            }
            left
        })
        .collect();
    seen.iter()
        .zip(counted)
        .map(|(s, left)| {
            let priority = s.priority.min(LOW);
            let blocked = blocking(&active, priority, &s.cards);
            let recent_kernel = match (blocked, left) {
                (true, k) if k >= 0 => -1,
                (false, k) if k < 0 => 0,
                (_, k) => k,
            };
            let throttled = match (s.policy, mode) {
                (Policy::Force, _) => true,
                (Policy::Disable, _) => false,
                (Policy::Default, SwitchMode::AlwaysOn) => true,
                (Policy::Default, SwitchMode::Feedback) => contended(&active, priority, &s.cards),
            };
            let switch = i32::from(throttled);
            let writes = Writes {
                recent_kernel: (recent_kernel != s.recent_kernel).then_some(recent_kernel),
                utilization_switch: (s.policy == Policy::Default && switch != s.utilization_switch).then_some(switch),
            };
            Decision { key: s.key.clone(), writes, blocked, throttled }
        })
        .collect()
}

/// HAMi's `CheckBlocking`: the first of the cards with any active region decides.
fn blocking(active: &Active, priority: u8, cards: &[String]) -> bool {
    let Some(counts) = cards.iter().find_map(|c| active.get(c)) else { return false };
    counts[..usize::from(priority)].iter().any(|n| *n > 0)
}

/// HAMi's `CheckPriority`: a higher priority active, or more than one of its own.
fn contended(active: &Active, priority: u8, cards: &[String]) -> bool {
    let p = usize::from(priority);
    cards.iter().filter_map(|c| active.get(c)).any(|counts| counts[..p].iter().any(|n| *n > 0) || counts[p] > 1)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn seen(key: &str, card: &str, priority: u8, recent_kernel: i32, switch: i32) -> Seen<String> {
        Seen {
            key: key.into(),
            cards: vec![card.into()],
            priority,
            policy: Policy::Default,
            recent_kernel,
            utilization_switch: switch,
        }
    }

    fn by_key(d: &[Decision<String>], key: &str) -> Decision<String> {
        d.iter().find(|d| d.key == key).unwrap().clone()
    }

    #[test]
    fn a_lone_active_pod_bursts_and_a_second_one_throttles_both() {
        let d = tick(&[seen("a", "g", LOW, 2, 1)], SwitchMode::Feedback);
        assert_eq!(d[0].writes, Writes { recent_kernel: Some(1), utilization_switch: Some(0) });
        let d = tick(&[seen("a", "g", LOW, 2, 0), seen("b", "g", LOW, 2, 0)], SwitchMode::Feedback);
        assert!(d.iter().all(|d| d.throttled && d.writes.utilization_switch == Some(1) && !d.blocked));
        // On another card they do not meet.
        let d = tick(&[seen("a", "g", LOW, 2, 1), seen("b", "h", LOW, 2, 1)], SwitchMode::Feedback);
        assert!(d.iter().all(|d| !d.throttled));
    }

    #[test]
    fn an_active_high_priority_pod_blocks_low_ones_on_its_card_until_it_stops() {
        let d =
            tick(&[seen("hi", "g", HIGH, 2, 1), seen("lo", "g", LOW, 2, 1), seen("other", "h", LOW, 2, 1)], SwitchMode::Feedback);
        let lo = by_key(&d, "lo");
        assert!(lo.blocked && lo.throttled);
        assert_eq!(lo.writes.recent_kernel, Some(-1));
        assert!(!by_key(&d, "other").blocked);
        let hi = by_key(&d, "hi");
        assert!(!hi.blocked && !hi.throttled, "the high one runs alone: {hi:?}");
        // The high one launched nothing since (1 counts down to 0): the low one is released.
        let d = tick(&[seen("hi", "g", HIGH, 1, 0), seen("lo", "g", LOW, -1, 1)], SwitchMode::Feedback);
        let lo = by_key(&d, "lo");
        assert!(!lo.blocked);
        assert_eq!(lo.writes.recent_kernel, Some(0));
    }

    #[test]
    fn strict_mode_and_the_claims_policy_keep_their_switch() {
        let d = tick(&[seen("a", "g", LOW, 2, 1)], SwitchMode::AlwaysOn);
        assert!(d[0].throttled);
        assert_eq!(d[0].writes.utilization_switch, None);
        let mut forced = seen("a", "g", LOW, 2, 1);
        forced.policy = Policy::Force;
        let mut off = seen("b", "h", LOW, 2, 0);
        off.policy = Policy::Disable;
        let d = tick(&[forced, off], SwitchMode::Feedback);
        assert!(d.iter().all(|d| d.writes.utilization_switch.is_none()));
    }

    proptest! {
        /// The rules, stated over any node: nobody is blocked unless a strictly higher priority is
        /// active on its card; a blocked region always ends with -1 and only blocked ones do; a
        /// region is throttled exactly when a higher priority or two of its own are active on its
        /// card; writes name only what changes.
        #[test]
        fn the_rules_hold_for_any_node(regions in prop::collection::vec((0u8..3, 0u8..2, -2i32..4, 0i32..2), 0..12)) {
            let seen: Vec<Seen<usize>> = regions.iter().enumerate().map(|(i, (card, p, rk, sw))| Seen {
                key: i, cards: vec![format!("g{card}")], priority: *p, policy: Policy::Default, recent_kernel: *rk, utilization_switch: *sw,
            }).collect();
            let decisions = tick(&seen, SwitchMode::Feedback);
            let active = |s: &Seen<usize>| s.recent_kernel > 1;
            for (s, d) in seen.iter().zip(&decisions) {
                let higher_active = seen.iter().any(|o| o.cards == s.cards && o.priority < s.priority && active(o));
                prop_assert_eq!(d.blocked, higher_active);
                let rk = d.writes.recent_kernel.unwrap_or(s.recent_kernel);
                prop_assert_eq!(rk < 0, d.blocked);
                let same = seen.iter().filter(|o| o.cards == s.cards && o.priority == s.priority && active(o)).count();
                let contended = higher_active || same > 1;
                prop_assert_eq!(d.throttled, contended);
                prop_assert_eq!(d.writes.utilization_switch.is_some(), i32::from(contended) != s.utilization_switch);
                if let Some(k) = d.writes.recent_kernel { prop_assert_ne!(k, s.recent_kernel); }
            }
        }
    }
}
