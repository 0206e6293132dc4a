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

#[test]
fn a_connection_moved_for_a_key_is_not_steered_back() {
    let cpus = topology::allowed_cpus();
    if cpus.len() < 2 {
        println!("SKIPPED: one allowed CPU, no other worker to steer to");
        return;
    }
    let s = start_with(|c| {
        c.pin = true;
        c.threads = cpus.len();
    });
    let port = s.resp_port().unwrap();
    let cpu = cpus[0];
    let on = std::thread::spawn(move || {
        topology::pin_current_thread(cpu).expect("pin");
        let mut c = Resp::new(port);
        for _ in 0..ROUND_TRIPS {
            c.cmd(&["PING"]);
        }
        // Steered to worker 0 (CPU 0's); now moved for a key (DEBUG
        // MIGRATE stands for key affinity's move) to worker 1.
        assert_eq!(c.cmd(&["DEBUG", "MIGRATE", "1"]), V::Int(0));
        for _ in 0..ROUND_TRIPS {
            c.cmd(&["PING"]);
        }
        match c.cmd(&["DEBUG", "MIGRATE", "1"]) {
            V::Int(w) => w as usize,
            v => panic!("DEBUG MIGRATE answered {v:?}"),
        }
    })
    .join()
    .expect("client");
    assert_eq!(
        on, 1,
        "the client's CPU moved it back from its key's worker"
    );
}
