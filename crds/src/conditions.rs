//! Setting standard conditions the Kubernetes way: one entry per type, and `lastTransitionTime`
//! moves only when the status flips.

use crate::common::Condition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// Sets the condition `type_` in `conditions`; returns whether anything changed.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
) -> bool {
    let status = if status { "True" } else { "False" };
    if let Some(existing) = conditions.iter_mut().find(|c| c.type_ == type_) {
        let unchanged = existing.status == status
            && existing.reason == reason
            && existing.message == message
            && existing.observed_generation == observed_generation;
        if unchanged {
            return false;
        }
        if existing.status != status {
            existing.last_transition_time = Time(Timestamp::now());
        }
        existing.status = status.to_string();
        existing.reason = reason.to_string();
        existing.message = message.to_string();
        existing.observed_generation = observed_generation;
        return true;
    }
    conditions.push(Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        observed_generation,
        last_transition_time: Time(Timestamp::now()),
    });
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let mut conditions = Vec::new();
        assert!(set_condition(
            &mut conditions,
            "Ready",
            false,
            "Pending",
            "wait",
            Some(1)
        ));
        let first = conditions[0].last_transition_time.clone();
        assert!(!set_condition(
            &mut conditions,
            "Ready",
            false,
            "Pending",
            "wait",
            Some(1)
        ));
        assert!(set_condition(
            &mut conditions,
            "Ready",
            false,
            "Other",
            "why",
            Some(2)
        ));
        assert_eq!(conditions[0].last_transition_time, first);
        assert_eq!(conditions[0].reason, "Other");
        assert!(set_condition(
            &mut conditions,
            "Ready",
            true,
            "Serving",
            "",
            Some(2)
        ));
        assert!(conditions[0].last_transition_time.0 >= first.0);
        assert_eq!(conditions.len(), 1);
        assert!(set_condition(
            &mut conditions,
            "SLOMet",
            true,
            "Met",
            "",
            Some(2)
        ));
        assert_eq!(conditions.len(), 2);
    }
}
