//! `--schedule`: how the tenants on this agent share its device (the schedules of
//! `cotenant_executor::runtime::cosched`), and for `gacer` the planner thread that keeps the
//! plan matched to the tenants loaded.

use cotenant_executor::Device;
use cotenant_executor::gacer::{GacerPlan, Schedule};
use cotenant_executor::runtime::{CoSchedule, Planner};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleKind {
    /// Every instance issues freely (no co-schedule).
    MultiStream,
    /// One operator at a time across all tenants.
    Sequential,
    /// Operators resized and ordered by a searched GACER plan.
    Gacer,
}

pub fn parse(s: &str) -> Result<ScheduleKind, String> {
    match s {
        "multi-stream" => Ok(ScheduleKind::MultiStream),
        "sequential" => Ok(ScheduleKind::Sequential),
        "gacer" => Ok(ScheduleKind::Gacer),
        other => Err(format!(
            "unknown schedule {other:?}: expected multi-stream, sequential or gacer"
        )),
    }
}

/// How often the planner looks at the tenants.
const REPLAN_EVERY: Duration = Duration::from_secs(2);

/// The co-schedule every tenant of the agent joins, with its planner running for `gacer`;
/// `None` for multi-stream, where there is nothing to coordinate. `threads` is the agent's CPU
/// budget; the planner profiles on `device`.
pub fn start(kind: ScheduleKind, threads: usize, device: &Device) -> Option<Arc<CoSchedule>> {
    let co = match kind {
        ScheduleKind::MultiStream => return None,
        ScheduleKind::Sequential => CoSchedule::new(Schedule::Sequential),
        ScheduleKind::Gacer => CoSchedule::new(Schedule::gacer(GacerPlan::unregulated(&[]))),
    };
    if kind == ScheduleKind::Gacer {
        let mut planner = Planner::new(co.clone(), device, threads, threads);
        let spawned = std::thread::Builder::new()
            .name("cotenant-gacer-planner".into())
            .spawn(move || {
                loop {
                    match planner.tick() {
                        Ok(true) => tracing::info!("gacer: a plan for the new tenant mix"),
                        Ok(false) => {}
                        Err(e) => tracing::warn!(error = %e, "gacer: profiling for a plan failed"),
                    }
                    std::thread::sleep(REPLAN_EVERY);
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "gacer: no planner thread; the tenants run unregulated");
        }
    }
    tracing::info!(
        schedule = co.name(),
        "the tenants share the device under a co-schedule"
    );
    Some(co)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_a_typo_is_refused_with_the_choices() {
        assert_eq!(parse("gacer"), Ok(ScheduleKind::Gacer));
        assert_eq!(parse("sequential"), Ok(ScheduleKind::Sequential));
        assert_eq!(parse("multi-stream"), Ok(ScheduleKind::MultiStream));
        let e = parse("gaser").unwrap_err();
        assert!(
            e.contains("\"gaser\"") && e.contains("multi-stream, sequential or gacer"),
            "{e}"
        );
        assert!(start(ScheduleKind::MultiStream, 2, &Device::Cpu).is_none());
        assert_eq!(
            start(ScheduleKind::Sequential, 2, &Device::Cpu).map(|c| c.name()),
            Some("sequential")
        );
    }
}
