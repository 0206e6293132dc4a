//! CPU placement (`server::steer`): with pinned workers, a loopback
//! connection whose client runs on one CPU ends up on the worker pinned
//! to that CPU, wherever `SO_REUSEPORT` put it.

use crate::common::*;

/// Round trips a client makes: well over the checks a move needs
/// (`CHECK_EVERY_BATCHES * MOVE_AFTER_CHECKS`, one batch each).
const ROUND_TRIPS: u32 = 4 * server::steer::CHECK_EVERY_BATCHES * server::steer::MOVE_AFTER_CHECKS;

#[test]
fn a_loopback_connection_follows_its_clients_cpu() {
    let cpus = topology::allowed_cpus();
    let s = start_with(|c| {
        c.pin = true;
        c.threads = cpus.len();
    });
    let port = s.resp_port().unwrap();
    for (worker, &cpu) in cpus.iter().enumerate() {
        // Several connections per CPU: each lands on any worker.
        for _ in 0..4 {
            let on = std::thread::spawn(move || {
                topology::pin_current_thread(cpu).expect("pin");
                let mut c = Resp::new(port);
                for _ in 0..ROUND_TRIPS {
                    assert_eq!(c.cmd(&["PING"]), V::Simple("PONG".into()));
                }
                // The worker it runs on (a move to worker 0 after this
                // batch does not matter: the connection closes).
                match c.cmd(&["DEBUG", "MIGRATE", "0"]) {
                    V::Int(w) => w as usize,
                    v => panic!("DEBUG MIGRATE answered {v:?}"),
                }
            })
            .join()
            .expect("client");
            assert_eq!(on, worker, "client on CPU {cpu}");
        }
    }
}
