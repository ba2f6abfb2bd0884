//! A TCP proxy in front of the API server, so a test can cut a client off it (an outage as the
//! client sees it: open connections drop, new ones close at once) and restore it.

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
