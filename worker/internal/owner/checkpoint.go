package owner

import (
	"context"
	"errors"
	"reflect"
	"time"

	"github.com/sockfleet/sockfleet/shared/lease"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
	"github.com/sockfleet/sockfleet/shared/wakeup"
)

// checkpoint writes o's checkpoint once, with o.writeMu held, through the regime (in
// polling mode that write is the renew of o's lease) and acts on the returned item.
// It returns the store's error.
func (m *Manager) checkpoint(ctx context.Context, o *owned) error {
	if o.ctx.Err() != nil {
		return nil // stopping; its session releases it
	}
	if !m.rg.valid(o) {
		// Past the fence deadline (resumed after a stall, before the fence ran): never
		// extend such a lease, even if the write would succeed — a stale image
		// written back by an operator can make an old owner-and-version match again.
		// The fence, due now, stops it.
		return nil
	}
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, m.cfg.RenewInterval)
	defer cancel()
	p := progress(o)
	st := o.s.Status()
	if st != o.written {
		p.Status, p.Error = st.State, st.Error
	}
	c, err := m.rg.checkpoint(rctx, o, p)
	switch {
	case err == nil:
		o.written, o.writtenSeq = st, p.LastSeq
		o.writtenAt.Store(int64(start.Sub(m.started)))
		m.cfg.Log.Debug("checkpointed", "conn", o.lease.ID, "last_seq", p.LastSeq)
		m.act(o, c)
	case errors.Is(err, lease.ErrLost):
		if o.ctx.Err() == nil { // else: our own release won the race with this write
			m.cfg.Metrics.LeasesLost.Add(1)
			m.cfg.Log.Warn("lease lost; stopping", "conn", o.lease.ID, "err", err)
		}
		o.cancel(errLost)
	case errors.Is(err, lease.ErrNotFound):
		m.cfg.Log.Info("connection deleted; stopping", "conn", o.lease.ID)
		o.cancel(errDeleted)
	default:
		m.cfg.Metrics.RenewFailures.Add(1)
		m.cfg.EMF.Put(schema.MetricRenewFailures, 1)
		m.cfg.Log.Warn("checkpoint failed", "conn", o.lease.ID, "err", err)
	}
	return err
}

// act applies what a checkpoint returned: stop, or follow a new URL.
func (m *Manager) act(o *owned, c codec.Connection) {
	switch {
	case c.DesiredState != schema.Started:
		if _, err := schema.ParseState(string(c.DesiredState)); err != nil {
			// An operator's unknown value (a lowercase "started"): stop, and say which
			// value on the item, not a plain "stopped".
			m.cfg.Log.Warn("desired_state unusable; stopping", "conn", o.lease.ID, "err", err)
			o.cancel(unusable(err))
			return
		}
		m.cfg.Log.Info("desired_state changed; stopping", "conn", o.lease.ID, "desired_state", c.DesiredState)
		o.cancel(errStopped)
	case schema.ValidateURL(c.WSURL) != nil:
		err := schema.ValidateURL(c.WSURL)
		m.cfg.Log.Warn("ws_url unusable; stopping", "conn", o.lease.ID, "err", err)
		o.cancel(unusable(err))
	case c.SpecErr != nil:
		m.cfg.Log.Warn("spec unusable; stopping", "conn", o.lease.ID, "err", c.SpecErr)
		o.cancel(unusable(c.SpecErr))
	case c.Unrunnable() != nil:
		// A field no write repairs (nudged_at_ms, seq_epoch) that does not decode: stop
		// and say so, rather than release it to an acquire that would give it back.
		m.cfg.Log.Warn("item unusable; stopping", "conn", o.lease.ID, "err", c.Unrunnable())
		o.cancel(unusable(c.Unrunnable()))
	case !reflect.DeepEqual(c.Spec, o.lease.Spec):
		m.cfg.Log.Info("spec changed; releasing to restart with it", "conn", o.lease.ID)
		o.cancel(errSpecChanged)
	case c.WSURL != o.s.URL():
		m.cfg.Log.Info("ws_url changed; reconnecting", "conn", o.lease.ID)
		o.s.SetURL(c.WSURL)
	}
}

// check re-reads an owned connection by checkpointing it now, and acts on the result.
func (m *Manager) check(ctx context.Context, o *owned) (wakeup.Result, string) {
	o.writeMu.Lock()
	if o.ctx.Err() == nil {
		o.stopIn(ctx) // a stop it finds: the release joins the wakeup's trace
	}
	err := m.checkpoint(ctx, o)
	if o.ctx.Err() == nil {
		o.stopper.Store(nil) // still running: a later stop is not this wakeup's
	}
	o.writeMu.Unlock()
	if err != nil && !errors.Is(err, lease.ErrLost) && !errors.Is(err, lease.ErrNotFound) {
		return wakeup.Failed, err.Error()
	}
	switch cause := context.Cause(o.ctx); {
	case o.ctx.Err() == nil:
		return wakeup.AlreadyOwned, ""
	case errors.Is(cause, errLost):
		return wakeup.LostRace, cause.Error()
	default:
		return wakeup.NotStartable, cause.Error()
	}
}
