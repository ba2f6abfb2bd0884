//! Who this agent is, from the downward API: its pod (also the name of its GpuAgent), namespace,
//! node and pod IP, and the addresses it advertises in its status.

use std::net::SocketAddr;

/// The agent's identity and advertised addresses.
#[derive(Clone, Debug, PartialEq)]
pub struct Identity {
    /// Pod name, which is also the name of this agent's GpuAgent.
    pub name: String,
    pub namespace: String,
    pub node: Option<String>,
    /// `host:port` of the Open Inference Protocol endpoint.
    pub address: String,
    /// `host:port` of the Open Inference Protocol over gRPC: the host of `address`.
    pub grpc_address: String,
    /// `host:port` of `/metrics` and `/report`.
    pub admin_address: String,
}

/// The sockets the agent bound.
#[derive(Clone, Copy, Debug)]
pub struct Bound {
    pub listen: SocketAddr,
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
}

/// Reads the identity with `env` (a lookup such as `std::env::var`), for the ports actually
/// bound; explicit advertise addresses win over `$POD_IP:<port>`.
pub fn from_env(
    env: impl Fn(&str) -> Option<String>,
    bound: Bound,
    advertise: Option<String>,
    admin_advertise: Option<String>,
) -> Result<Identity, String> {
    let required = |key: &str| {
        env(key).filter(|v| !v.is_empty()).ok_or_else(|| {
            format!("{key} is not set: the agent pod gets it from the downward API (fieldRef)")
        })
    };
    let name = required("POD_NAME")?;
    let namespace = required("POD_NAMESPACE")?;
    let node = env("NODE_NAME").filter(|v| !v.is_empty());
    let pod_ip = env("POD_IP").filter(|v| !v.is_empty());
    let at = |port: u16, explicit: Option<String>, flag: &str| match (explicit, &pod_ip) {
        (Some(address), _) => Ok(address),
        (None, Some(ip)) => Ok(host_port(ip, port)),
        (None, None) => Err(format!(
            "POD_IP is not set and {flag} is not given: the agent cannot say where it serves"
        )),
    };
    let address = at(bound.listen.port(), advertise, "--advertise-address")?;
    Ok(Identity {
        grpc_address: with_port(&address, bound.grpc.port()),
        address,
        admin_address: at(
            bound.admin.port(),
            admin_advertise,
            "--admin-advertise-address",
        )?,
        name,
        namespace,
        node,
    })
}

/// `address` (`host:port`) with its port replaced by `port`.
fn with_port(address: &str, port: u16) -> String {
    match address.rsplit_once(':') {
        Some((host, _)) => format!("{host}:{port}"),
        None => format!("{address}:{port}"),
    }
}

/// `ip:port`, with brackets around an IPv6 address.
fn host_port(ip: &str, port: u16) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |key| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    /// HTTP on `listen`, admin on `admin`, gRPC on port 8001 of `listen`'s address.
    fn bound(listen: &str, admin: &str) -> Bound {
        let listen: SocketAddr = listen.parse().expect("address");
        Bound {
            listen,
            grpc: SocketAddr::new(listen.ip(), 8001),
            admin: admin.parse().expect("address"),
        }
    }

    #[test]
    fn advertises_the_pod_ip_with_the_bound_ports() {
        let id = from_env(
            env(&[
                ("POD_NAME", "agent-0"),
                ("POD_NAMESPACE", "gpu"),
                ("NODE_NAME", "n1"),
                ("POD_IP", "10.0.0.7"),
            ]),
            bound("0.0.0.0:8000", "0.0.0.0:8002"),
            None,
            None,
        )
        .expect("identity");
        assert_eq!(id.address, "10.0.0.7:8000");
        assert_eq!(id.grpc_address, "10.0.0.7:8001");
        assert_eq!(id.admin_address, "10.0.0.7:8002");
        assert_eq!(id.node.as_deref(), Some("n1"));
    }

    #[test]
    fn ipv6_and_explicit_addresses() {
        let id = from_env(
            env(&[
                ("POD_NAME", "a"),
                ("POD_NAMESPACE", "b"),
                ("POD_IP", "fd00::1"),
            ]),
            bound("[::]:8000", "[::]:8002"),
            None,
            Some("agent.example:9".into()),
        )
        .expect("identity");
        assert_eq!(id.address, "[fd00::1]:8000");
        assert_eq!(id.grpc_address, "[fd00::1]:8001");
        assert_eq!(id.admin_address, "agent.example:9");
        assert_eq!(id.node, None);
    }

    #[test]
    fn missing_downward_api_values_are_named() {
        let e = from_env(
            env(&[("POD_NAME", "a")]),
            bound("0.0.0.0:1", "0.0.0.0:2"),
            None,
            None,
        )
        .expect_err("no namespace");
        assert!(e.contains("POD_NAMESPACE"), "{e}");
        let e = from_env(
            env(&[("POD_NAME", "a"), ("POD_NAMESPACE", "b")]),
            bound("0.0.0.0:1", "0.0.0.0:2"),
            None,
            None,
        )
        .expect_err("no ip");
        assert!(e.contains("POD_IP"), "{e}");
    }
}
