//! The reasons the operator writes on conditions and on the Events it records. Users, alerts
//! and tests read these strings: each is the variant's name, byte for byte.

/// An enum of reasons whose strings are the variants' names.
macro_rules! reasons {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident,)* }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        impl $name {
            // Not every enum uses both outside the tests.
            /// Every reason, in declaration order.
            #[allow(dead_code)]
            pub const ALL: &[$name] = &[$($name::$variant,)*];

            /// The reason as written to the API.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => stringify!($variant),)*
                }
            }

            /// The reason `s` names, if it is one of these.
            #[allow(dead_code)]
            pub fn parse(s: &str) -> Option<$name> {
                Self::ALL.iter().copied().find(|r| r.as_str() == s)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        /// Compares with the reason as written, e.g. a condition's `reason` field.
        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }
    };
}

reasons! {
    /// Why a condition has its status: a tenant's Ready, ModelLoaded and SLOMet, a pool's Ready.
    pub enum Reason {
        // A tenant's Ready.
        /// Every replica it wants is ready and the SLO is met.
        Serving,
        /// Serving on one replica while its profile is measured.
        Profiling,
        /// Meeting the SLO with fewer replicas ready than wanted.
        ScalingUp,
        /// No agent has room for a replica yet.
        AwaitingAgents,
        /// Its Service name belongs to another object.
        ServiceConflict,
        InvalidSpec,
        InvalidName,
        PoolNotFound,
        /// Its pool runs agents in a namespace the operator does not manage.
        PoolNotManaged,
        // A tenant's ModelLoaded (and Ready, when the model cannot run).
        Loading,
        Loaded,
        LoadFailed,
        /// One replica needs more memory than the pool's largest agent has.
        ModelTooLarge,
        // A tenant's SLOMet (and Ready, when degraded).
        WithinSLO,
        SLOViolated,
        NoTraffic,
        // A pool's Ready.
        AgentsReady,
        AgentsPending,
        AtMaxAgents,
        /// The operator could not carry out the pool's decisions.
        ApplyFailed,
        /// The operator runs no agents in the pool's agent namespace.
        NamespaceNotManaged,
        // An agent's own Ready, as the agent writes it.
        /// The agent cannot use the GPU it was started for.
        DeviceUnavailable,
    }
}

reasons! {
    /// Why the operator records an Event.
    pub enum EventReason {
        // On a pool.
        ScaledUp,
        Draining,
        ScaledDown,
        /// An agent runs an older template: its replicas move, then it is replaced.
        Replacing,
        AgentDeviceUnavailable,
        // On a tenant.
        ModelChanged,
        /// The approach and knobs chosen from a new profile, which the message lists.
        ApproachChosen,
        KnobsChanged,
        ReplicasChanged,
        LoadFailed,
        ModelTooLarge,
        ServiceConflict,
        /// Its caller-credentials Secret cannot be used.
        CredentialsUnavailable,
        /// Its model-credentials Secret cannot be used.
        ModelCredentialsUnavailable,
        // On a GpuAgent.
        /// Its report is of another version than the operator's.
        ReportVersionMismatch,
    }
}

impl EventReason {
    /// Whether the Event is a Warning (something a user must act on) rather than Normal.
    pub const fn is_warning(self) -> bool {
        matches!(
            self,
            EventReason::LoadFailed
                | EventReason::ModelTooLarge
                | EventReason::ServiceConflict
                | EventReason::ModelCredentialsUnavailable
                | EventReason::ReportVersionMismatch
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_written_as_their_names() {
        assert_eq!(Reason::SLOViolated.as_str(), "SLOViolated");
        assert_eq!(Reason::WithinSLO.to_string(), "WithinSLO");
        assert_eq!(
            EventReason::AgentDeviceUnavailable.as_str(),
            "AgentDeviceUnavailable"
        );
        for r in Reason::ALL {
            assert_eq!(Reason::parse(r.as_str()), Some(*r));
        }
        for r in EventReason::ALL {
            assert_eq!(EventReason::parse(r.as_str()), Some(*r));
        }
        assert_eq!(Reason::parse("Ready"), None);
    }

    #[test]
    fn warnings_are_what_a_user_must_act_on() {
        let warnings: Vec<&str> = EventReason::ALL
            .iter()
            .filter(|r| r.is_warning())
            .map(|r| r.as_str())
            .collect();
        assert_eq!(
            warnings,
            [
                "LoadFailed",
                "ModelTooLarge",
                "ServiceConflict",
                "ModelCredentialsUnavailable",
                "ReportVersionMismatch"
            ]
        );
    }
}
