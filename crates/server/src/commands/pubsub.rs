//! Pub/sub commands: SUBSCRIBE, UNSUBSCRIBE, PSUBSCRIBE, PUNSUBSCRIBE,
//! PUBLISH, PUBSUB CHANNELS/NUMSUB/NUMPAT, and the sharded forms
//! SSUBSCRIBE, SUNSUBSCRIBE, SPUBLISH, PUBSUB SHARDCHANNELS/SHARDNUMSUB
//! with redis-server 7.0's standalone semantics: shard channels are a
//! namespace of their own (SPUBLISH reaches only SSUBSCRIBEd clients, no
//! patterns), their confirmations count the shard channels alone, and
//! messages arrive as `smessage`. Delivery (the sharded registry,
//! the per-connection mailboxes and their output buffer limits) is in
//! [`crate::pubsub`]; the connection loop drains its mailbox.
//!
//! Replies follow Redis 7: one `subscribe`/`unsubscribe`/... array per
//! channel, carrying the connection's total subscription count, as a push
//! (`>`) in RESP3. A RESP2 connection with any subscription accepts only
//! the subscribe family, PING (answered `*2 pong <msg>`), QUIT and RESET
//! (dispatch refuses the rest, see [`allowed_subscribed`]); a RESP3 one
//! may run anything between pushes.
//!
//! Order against the connection's own replies: before a pub/sub command
//! writes its reply, it first moves the messages already in the
//! connection's mailbox into the output, so a message published before an
//! UNSUBSCRIBE (or before this connection's own PUBLISH that delivers to
//! itself) reaches the client before that command's reply, as in Redis,
//! where PUBLISH writes straight into each receiver's output buffer.

use super::{eq, CmdResult, Ctx, Spec};
use crate::pubsub::Subs;
use crate::resp::{Proto, Reply};

/// May a RESP2 connection with subscriptions run `spec`?
pub fn allowed_subscribed(_ctx: &Ctx, spec: &Spec) -> bool {
    matches!(
        spec.name,
        "subscribe"
            | "psubscribe"
            | "ssubscribe"
            | "unsubscribe"
            | "punsubscribe"
            | "sunsubscribe"
            | "ping"
            | "quit"
            | "reset"
    )
}

/// Is this connection a RESP2 subscriber (for PING's reply shape)?
pub fn resp2_subscriber(ctx: &Ctx, r: &Reply) -> bool {
    ctx.sess.subs.is_some() && r.proto == Proto::Resp2
}

/// Move the messages waiting in this connection's mailbox to its output.
fn drain_own(ctx: &Ctx, r: &mut Reply) {
    if let Some(s) = &ctx.sess.subs {
        s.mailbox.drain(r.out, r.proto, usize::MAX);
    }
}

/// Leave every channel and pattern (RESET): no replies.
pub fn leave_all(ctx: &mut Ctx) {
    ctx.sess.subs = None;
}

fn subs<'c>(ctx: &'c mut Ctx) -> &'c mut Subs {
    let (hub, info) = (ctx.shared.pubsub.clone(), ctx.sess.info.clone());
    ctx.sess.subs.get_or_insert_with(|| Subs::new(hub, info))
}

/// One confirmation: `[kind, name, count]`.
fn confirm(r: &mut Reply, kind: &str, name: Option<&[u8]>, count: usize) {
    r.push(3);
    r.bulk(kind.as_bytes());
    r.opt_bulk(name);
    r.int(count as i64);
}

/// Drop the subscription state once nothing is subscribed (a RESP2
/// connection may then run every command again).
fn settle(ctx: &mut Ctx) {
    if ctx.sess.subs.as_ref().is_some_and(|s| s.total() == 0) {
        ctx.sess.subs = None;
    }
}

/// SUBSCRIBE channel [channel ...].
pub fn subscribe(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    drain_own(ctx, r);
    let s = subs(ctx);
    for &ch in &a[1..] {
        s.subscribe(ch);
        confirm(r, "subscribe", Some(ch), s.count());
    }
    Ok(())
}

/// PSUBSCRIBE pattern [pattern ...].
pub fn psubscribe(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    drain_own(ctx, r);
    let s = subs(ctx);
    for &p in &a[1..] {
        s.psubscribe(p);
        confirm(r, "psubscribe", Some(p), s.count());
    }
    Ok(())
}

/// What an unsubscribe leaves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Leave {
    Channels,
    Patterns,
    Shard,
}

/// UNSUBSCRIBE [channel ...], PUNSUBSCRIBE [pattern ...] and
/// SUNSUBSCRIBE [shardchannel ...].
fn leave(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply, what: Leave) {
    drain_own(ctx, r);
    let kind = match what {
        Leave::Channels => "unsubscribe",
        Leave::Patterns => "punsubscribe",
        Leave::Shard => "sunsubscribe",
    };
    let names: Vec<Box<[u8]>> = if a.len() > 1 {
        a[1..].iter().map(|&n| n.into()).collect()
    } else {
        match &ctx.sess.subs {
            Some(s) => match what {
                Leave::Channels => s.channel_list(),
                Leave::Patterns => s.pattern_list(),
                Leave::Shard => s.shard_channel_list(),
            },
            None => Vec::new(),
        }
    };
    if names.is_empty() {
        let n = match (&ctx.sess.subs, what) {
            (Some(s), Leave::Shard) => s.shard_count(),
            (Some(s), _) => s.count(),
            (None, _) => 0,
        };
        confirm(r, kind, None, n);
    }
    for n in &names {
        let count = match &mut ctx.sess.subs {
            Some(s) => match what {
                Leave::Channels => {
                    s.unsubscribe(n);
                    s.count()
                }
                Leave::Patterns => {
                    s.punsubscribe(n);
                    s.count()
                }
                Leave::Shard => {
                    s.sunsubscribe(n);
                    s.shard_count()
                }
            },
            None => 0,
        };
        confirm(r, kind, Some(n), count);
    }
    settle(ctx);
}

/// UNSUBSCRIBE [channel ...].
pub fn unsubscribe(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    leave(ctx, a, r, Leave::Channels);
    Ok(())
}

/// PUNSUBSCRIBE [pattern ...].
pub fn punsubscribe(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    leave(ctx, a, r, Leave::Patterns);
    Ok(())
}

/// SSUBSCRIBE shardchannel [shardchannel ...]. Refused inside a
/// transaction, as redis-server refuses it to a client that may not block.
pub fn ssubscribe(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    if ctx.sess.in_exec {
        return Err("ERR SSUBSCRIBE isn't allowed for a DENY BLOCKING client".into());
    }
    drain_own(ctx, r);
    let s = subs(ctx);
    for &ch in &a[1..] {
        s.ssubscribe(ch);
        confirm(r, "ssubscribe", Some(ch), s.shard_count());
    }
    Ok(())
}

/// SUNSUBSCRIBE [shardchannel ...].
pub fn sunsubscribe(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    leave(ctx, a, r, Leave::Shard);
    Ok(())
}

/// SPUBLISH shardchannel message.
pub fn spublish(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let n = ctx.shared.pubsub.spublish(a[1], a[2]);
    drain_own(ctx, r);
    r.int(n as i64);
    Ok(())
}

/// PUBLISH channel message.
pub fn publish(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let n = ctx.shared.pubsub.publish(a[1], a[2]);
    drain_own(ctx, r);
    r.int(n as i64);
    Ok(())
}

/// PUBSUB CHANNELS \[pattern\] | NUMSUB [channel ...] | NUMPAT |
/// SHARDCHANNELS \[pattern\] | SHARDNUMSUB \[shardchannel ...\].
pub fn pubsub(ctx: &mut Ctx, a: &[&[u8]], r: &mut Reply) -> CmdResult {
    let hub = &ctx.shared.pubsub;
    let sub = a[1];
    let arity_err = |name: &str| {
        Err(format!("ERR wrong number of arguments for 'pubsub|{name}' command").into())
    };
    let syntax_err = || {
        Err(format!(
            "ERR unknown subcommand or wrong number of arguments for '{}'. Try PUBSUB HELP.",
            super::shown(sub)
        )
        .into())
    };
    if eq(sub, "channels") || eq(sub, "shardchannels") {
        if a.len() > 3 {
            return syntax_err();
        }
        let chans = if eq(sub, "channels") {
            hub.channels(a.get(2).copied())
        } else {
            hub.shard_channels(a.get(2).copied())
        };
        r.bulks(chans.iter());
    } else if eq(sub, "numsub") || eq(sub, "shardnumsub") {
        let shard = eq(sub, "shardnumsub");
        r.array(2 * (a.len() - 2));
        for &ch in &a[2..] {
            r.bulk(ch);
            let n = if shard {
                hub.shard_numsub(ch)
            } else {
                hub.numsub(ch)
            };
            r.int(n as i64);
        }
    } else if eq(sub, "numpat") {
        if a.len() != 2 {
            return arity_err("numpat");
        }
        r.int(hub.numpat() as i64);
    } else {
        return Err(format!(
            "ERR unknown subcommand '{}'. Try PUBSUB HELP.",
            super::shown(sub)
        )
        .into());
    }
    Ok(())
}
