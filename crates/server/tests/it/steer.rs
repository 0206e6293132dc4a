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

/// A client on CPU 0 that waited on a key owned by worker 1 moved there
/// and is bound to the key: while it keeps to that key it stays on
/// worker 1; once its commands go to many other keys, it is unbound and
/// steered to CPU 0's worker.
#[test]
fn a_connection_bound_to_a_key_is_steered_once_it_leaves_the_key() {
    let cpus = topology::allowed_cpus();
    if cpus.len() != 2 {
        println!("SKIPPED: needs exactly 2 allowed CPUs, has {}", cpus.len());
        return;
    }
    let s = start_with(|c| {
        c.pin = true;
        c.threads = 2;
    });
    let port = s.resp_port().unwrap();
    let cpu = cpus[0];
    let (kept, left) = std::thread::spawn(move || {
        topology::pin_current_thread(cpu).expect("pin");
        let mut c = Resp::new(port);
        for _ in 0..ROUND_TRIPS {
            c.cmd(&["PING"]);
        }
        // DEBUG MIGRATE to the worker it is on answers it and moves
        // nothing (a move would bind the connection for good).
        let worker = |c: &mut Resp, on: usize| match c.cmd(&["DEBUG", "MIGRATE", &on.to_string()]) {
            V::Int(w) => w as usize,
            v => panic!("DEBUG MIGRATE answered {v:?}"),
        };
        assert_eq!(worker(&mut c, 0), 0, "steered to CPU 0's worker");
        let stay = std::time::Duration::from_millis(server::migrate::MIN_STAY_MS + 50);
        // Its steering move may be recent: a blocked wait moves only
        // after the least stay.
        std::thread::sleep(stay);
        let k = key_owned_by(1, "queue");
        assert_eq!(c.cmd(&["BLPOP", &k, "0.05"]), V::Null);
        std::thread::sleep(stay);
        for _ in 0..ROUND_TRIPS {
            c.cmd(&["LPUSH", &k, "x"]);
        }
        let kept = worker(&mut c, 1);
        for i in 0..ROUND_TRIPS {
            c.cmd(&["SET", &format!("spread:{i}"), "v"]);
        }
        (kept, worker(&mut c, 0))
    })
    .join()
    .expect("client");
    assert_eq!(kept, 1, "left its key's worker while it kept to the key");
    assert_eq!(left, 0, "still on the key's worker after leaving the key");
}
