//! A TCP proxy in front of the API server, so a test can cut a client off it (an outage as the
//! client sees it: open connections drop, new ones close at once) and restore it; and a proxy
//! that cuts off or stalls every response it forwards.

use std::io::ErrorKind;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct TcpProxy {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

struct Shared {
    upstream: String,
    open: AtomicBool,
    stopped: AtomicBool,
    connections: Mutex<Vec<TcpStream>>,
}

impl TcpProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream` (`host:port`).
    pub fn start(upstream: &str) -> std::io::Result<TcpProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream: upstream.to_string(),
            open: AtomicBool::new(true),
            stopped: AtomicBool::new(false),
            connections: Mutex::new(Vec::new()),
        });
        let accepting = shared.clone();
        std::thread::spawn(move || accept_loop(&listener, &accepting));
        Ok(TcpProxy { addr, shared })
    }

    /// The outage begins: every open connection is closed, and new ones are closed at once.
    pub fn cut(&self) {
        self.shared.open.store(false, Ordering::SeqCst);
        self.shared.close_all();
    }

    /// The outage ends.
    pub fn restore(&self) {
        self.shared.open.store(true, Ordering::SeqCst);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.shared.close_all();
    }
}

impl Shared {
    fn close_all(&self) {
        let mut connections = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        for c in connections.drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(listener: &TcpListener, shared: &Shared) {
    while !shared.stopped.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((client, _)) => {
                if shared.open.load(Ordering::SeqCst) {
                    let _ = forward(client, shared);
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Pipes `client` to a new upstream connection, both ways, until either side closes.
fn forward(client: TcpStream, shared: &Shared) -> std::io::Result<()> {
    client.set_nonblocking(false)?;
    let server = TcpStream::connect(&shared.upstream)?;
    {
        let mut connections = shared.connections.lock().unwrap_or_else(|e| e.into_inner());
        connections.push(client.try_clone()?);
        connections.push(server.try_clone()?);
    }
    for (mut from, mut to) in [(client.try_clone()?, server.try_clone()?), (server, client)] {
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Both);
            let _ = from.shutdown(Shutdown::Both);
        });
    }
    Ok(())
}

/// What a [`FaultyProxy`] does to the responses it forwards.
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// Closes the connection once this many bytes of the response went through.
    Cut(usize),
    /// Forwards this many bytes of the response, then nothing more, holding the connection open.
    Stall(usize),
}

/// A TCP proxy that spoils every response the same way (a transfer cut off, or stalled), for
/// tests of what a client does with a broken download.
pub struct FaultyProxy {
    pub addr: SocketAddr,
    stopped: Arc<AtomicBool>,
}

impl FaultyProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream` (`host:port`),
    /// the requests whole and the responses spoilt by `fault`.
    pub fn start(upstream: &str, fault: Fault) -> std::io::Result<FaultyProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stopped = Arc::new(AtomicBool::new(false));
        let (upstream, flag) = (upstream.to_string(), stopped.clone());
        std::thread::spawn(move || {
            while !flag.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let (upstream, flag) = (upstream.clone(), flag.clone());
                        std::thread::spawn(move || {
                            let _ = spoil(client, &upstream, fault, &flag);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Ok(FaultyProxy { addr, stopped })
    }
}

impl Drop for FaultyProxy {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
    }
}

/// Forwards `client`'s requests to `upstream` and at most the fault's bytes of the responses.
fn spoil(
    client: TcpStream,
    upstream: &str,
    fault: Fault,
    stopped: &AtomicBool,
) -> std::io::Result<()> {
    use std::io::{Read, Write};
    client.set_nonblocking(false)?;
    let server = TcpStream::connect(upstream)?;
    let (mut requests, mut to_server) = (client.try_clone()?, server.try_clone()?);
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut requests, &mut to_server);
    });
    let (mut responses, mut to_client) = (server.try_clone()?, client.try_clone()?);
    let limit = match fault {
        Fault::Cut(n) | Fault::Stall(n) => n,
    };
    let mut sent = 0;
    let mut buf = [0u8; 16 << 10];
    while sent < limit {
        let n = responses.read(&mut buf[..(limit - sent).min(16 << 10)])?;
        if n == 0 {
            break;
        }
        to_client.write_all(&buf[..n])?;
        sent += n;
    }
    if let Fault::Stall(_) = fault {
        while !stopped.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    let _ = server.shutdown(Shutdown::Both);
    Ok(())
}
