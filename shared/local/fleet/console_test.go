package fleet_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/sockfleet/sockfleet/shared/local/fleet"
	"github.com/sockfleet/sockfleet/shared/schema"
	"github.com/sockfleet/sockfleet/shared/schema/codec"
)

// Bounds of TestConsoleEdits (issue 21, "Figures to reach").
const (
	// consoleResume: each connection streams again this soon after an edit whose
	// record passes an event filter.
	consoleResume = 2 * time.Second
	// consoleBackstop: where no record passes a filter, the holder's backstop read is
	// the bound (startFleetWith: 2 × testRenew), plus its confirming write and the
	// acquire and dial that follow a release.
	consoleBackstop = 2*testRenew + consoleResume
	// consoleIdle: a worker streaming at the test rate writes a batch every few tens
	// of ms; arrivals further apart than this are two spans (fleet.TwoDeliverers).
	consoleIdle = 400 * time.Millisecond
)

// consoleRow is one console edit, made on its own connection.
type consoleRow struct {
	name string
	// bound: how soon the connection must stream again (consoleResume, or
	// consoleBackstop where no record passes a filter); 0 for an edit that must stop
	// it with status invalid naming field.
	bound time.Duration
	field string
	id    string
	at    time.Time // when the edit was written
	// acquiredBefore: the worker logs' acquisitions of id before the edit.
	acquiredBefore int
}

// TestConsoleEdits makes, on a streaming fleet (3 workers, 24 connections, real
// sockets, a collector sink), every kind of console edit issue 21 lists, each on its
// own connection, and checks per edit: never two workers delivering the connection
// at once (0 ms, fleet.TwoDeliverers), and the connection streaming again within its
// bound — or, for a mistyped advisory attribute, stopped with status invalid naming
// it, after at most one acquire.
func TestConsoleEdits(t *testing.T) {
	if testing.Short() {
		t.Skip("fleet test")
	}
	f, col, ids := collectorFleet(t, 3, 24, "e")
	ctx := context.Background()
	live := func() map[string]bool {
		out := map[string]bool{}
		for slot := range 3 {
			if p := f.stack.Sup.Get(slot); p != nil {
				select {
				case <-p.Done():
				default:
					out[p.ID] = true
				}
			}
		}
		return out
	}
	other := func(owner string) string { // a live worker other than owner
		for w := range live() {
			if w != owner {
				return w
			}
		}
		t.Fatalf("no live worker but %s", owner)
		return ""
	}
	update := func(id, expr string, vals map[string]types.AttributeValue) {
		t.Helper()
		in := &dynamodb.UpdateItemInput{TableName: &f.env.Table, UpdateExpression: aws.String(expr),
			Key: map[string]types.AttributeValue{schema.AttrPK: codec.S(schema.ConnKey(id))}}
		if len(vals) > 0 {
			in.ExpressionAttributeValues = vals
		}
		if _, err := f.env.DB.UpdateItem(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	var rows []*consoleRow
	next := 0
	row := func(name string, bound time.Duration) *consoleRow {
		r := &consoleRow{name: name, bound: bound, id: ids[next]}
		next++
		r.acquiredBefore = acquisitions(f.dir, r.id)
		rows = append(rows, r)
		return r
	}
	// image returns id's item as it is, with its owner's slot.
	image := func(id string) (codec.Item, codec.Connection) {
		it := f.rawConn(id)
		c, err := codec.DecodeConnection(it)
		if err != nil || !c.Owned() {
			t.Fatalf("%s is not a healthy owned item: %+v, %v", id, c, err)
		}
		return it, c
	}
	put := func(r *consoleRow, it codec.Item) {
		r.at = time.Now()
		f.putRaw(it)
	}

	// A stale whole-item image naming a departed worker: the images of a worker's
	// connections are saved, the worker is killed, its connections move, and the
	// saved images are written back (the scenario of issue 21).
	{
		slot, victim, mine := -1, "", []string(nil)
		for s := range 3 {
			p := f.stack.Sup.Get(s)
			if owned := f.ownedBy(p.ID); len(owned) > len(mine) {
				slot, victim, mine = s, p.ID, owned
			}
		}
		saved := map[string]codec.Item{}
		for _, id := range mine {
			saved[id] = f.rawConn(id)
		}
		if err := f.stack.Sup.Signal(slot, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "the killed worker's connections streaming elsewhere", func() (bool, string) {
			return f.streamingElsewhere(mine, victim)
		})
		// Five of them get their stale image back; the rest are free for the other rows.
		for i, id := range mine[:min(5, len(mine))] {
			r := &consoleRow{name: fmt.Sprintf("stale image naming a departed worker (%d)", i), bound: consoleBackstop, id: id,
				acquiredBefore: acquisitions(f.dir, id)}
			rows = append(rows, r)
		}
		edited := map[string]bool{}
		for _, r := range rows {
			edited[r.id] = true
		}
		var rest []string
		for _, id := range ids {
			if !edited[id] {
				rest = append(rest, id)
			}
		}
		ids = rest
		for _, r := range rows {
			put(r, saved[r.id])
		}
		t.Logf("killed %s; wrote back the saved images of %d of its %d connections", victim, len(rows), len(mine))
	}

	// A stale image naming a live worker: the item as it was when that worker held it
	// at a lower version.
	{
		r := row("stale image naming a live worker", consoleBackstop)
		it, c := image(r.id)
		it[schema.AttrLeaseOwner] = codec.S(other(c.LeaseOwner))
		it[schema.AttrLeaseVersion] = codec.N(c.LeaseVersion - 1000)
		put(r, it)
	}
	// A stale image with no owner: the item as it was released, before the acquire.
	{
		r := row("stale image naming no owner", consoleResume)
		it, c := image(r.id)
		delete(it, schema.AttrLeaseOwner)
		it[schema.AttrLeaseExpires] = codec.N(0)
		it[schema.AttrLeaseVersion] = codec.N(c.LeaseVersion - 1000)
		it[schema.AttrStatus] = codec.S("released")
		put(r, it)
	}
	// Lease fields deleted or changed by hand on an owned item.
	for _, e := range []struct {
		name, expr string
		bound      time.Duration
		val        func(c codec.Connection) map[string]types.AttributeValue
	}{
		{"lease_expires_at_ms deleted", "REMOVE lease_expires_at_ms", consoleResume, nil},
		{"lease_expires_at_ms zeroed", "SET lease_expires_at_ms = :v", consoleResume,
			func(codec.Connection) map[string]types.AttributeValue {
				return map[string]types.AttributeValue{":v": codec.N(0)}
			}},
		{"lease_owner deleted", "REMOVE lease_owner", consoleBackstop, nil},
		{"lease_owner set to another live worker", "SET lease_owner = :v", consoleBackstop,
			func(c codec.Connection) map[string]types.AttributeValue {
				return map[string]types.AttributeValue{":v": codec.S(other(c.LeaseOwner))}
			}},
	} {
		r := row(e.name, e.bound)
		_, c := image(r.id)
		var vals map[string]types.AttributeValue
		if e.val != nil {
			vals = e.val(c)
		}
		r.at = time.Now()
		update(r.id, e.expr, vals)
	}
	// "Create item" and "Duplicate item" naming a live worker, which runs no session
	// for it: a new connection (a new key and stream) with another item's lease fields.
	for i, name := range []string{"create item naming a live worker", "duplicate item naming its live owner"} {
		id := fmt.Sprintf("n%02d", i)
		r := &consoleRow{name: name, bound: consoleResume, id: id}
		rows = append(rows, r)
		it, c := image(ids[next])
		next++
		owner := c.LeaseOwner
		if i == 0 {
			owner = other(c.LeaseOwner)
			delete(it, schema.AttrLastSeq)
		}
		it[schema.AttrPK] = codec.S(schema.ConnKey(id))
		it[schema.AttrWSURL] = codec.S(f.up.URL(id))
		it[schema.AttrLeaseOwner] = codec.S(owner)
		put(r, it)
	}
	// Delete then recreate: the item is deleted, its owner stops, and the item is
	// written back as it was (naming that owner, at its version).
	{
		r := row("delete then recreate", consoleResume)
		it, _ := image(r.id)
		if _, err := f.env.DB.DeleteItem(ctx, &dynamodb.DeleteItemInput{TableName: &f.env.Table,
			Key: map[string]types.AttributeValue{schema.AttrPK: it[schema.AttrPK]}}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, r.id+" closed after its deletion", func() (bool, string) {
			st := f.up.Stats(r.id)
			return st.Clients == 0, fmt.Sprintf("%d clients", st.Clients)
		})
		put(r, it)
	}
	// A mistyped advisory attribute on a streaming connection.
	for _, field := range []string{schema.AttrNudgedAt, schema.AttrEpoch} {
		r := row(field+" written as a string", 0)
		r.field = field
		r.at = time.Now()
		update(r.id, "SET "+field+" = :v", map[string]types.AttributeValue{":v": codec.S("12x")})
	}

	// Let every edit play out for the longest bound and a little more.
	var last time.Time
	for _, r := range rows {
		if r.at.After(last) {
			last = r.at
		}
	}
	time.Sleep(time.Until(last.Add(consoleBackstop + 2*time.Second)))
	end := time.Now()

	var mu sync.Mutex
	var table []string
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			arr := col.Arrivals(r.id)
			two := fleet.TwoDeliverers(arr, consoleIdle)
			if two > 0 {
				t.Errorf("%s: two workers delivered at once for %s", r.id, two)
			}
			if err := fleet.CheckOneDeliverer(arr); err != nil {
				t.Errorf("%s: %v", r.id, err)
			}
			if t.Failed() {
				for _, s := range fleet.Stints(arr) {
					t.Logf("  %s: %s %d..%d, %s .. %s", r.id, s.Worker, s.First, s.Last, s.From.Format("15:04:05.000"), s.To.Format("15:04:05.000"))
				}
			}
			c, _ := codec.DecodeConnection(f.rawConn(r.id)) // an unusable item decodes with an error
			after := acquisitions(f.dir, r.id) - r.acquiredBefore
			var got string
			if r.bound == 0 {
				got = invalidRow(t, f, r, c, after)
			} else {
				got = streamingRow(t, f, r, c, arr, end, live())
			}
			mu.Lock()
			table = append(table, fmt.Sprintf("| %s | %s | %d ms | %s |", r.name, r.id, two.Milliseconds(), got))
			mu.Unlock()
		})
	}
	t.Logf("per edit:\n| edit | connection | two deliverers | result |\n|---|---|---|---|\n%s", strings.Join(table, "\n"))
}

// streamingRow checks that r's connection streams again within r.bound of its edit
// and still does at end, and says how soon it did.
func streamingRow(t *testing.T, f *testFleet, r *consoleRow, c codec.Connection, arr []fleet.Arrival, end time.Time, live map[string]bool) string {
	t.Helper()
	// The longest silence at the sink from the edit on (a silence before it is not
	// the edit's doing).
	prev, silence := r.at, time.Duration(0)
	var resumed time.Duration
	for _, a := range arr {
		if a.At.Before(r.at) {
			continue
		}
		if gap := a.At.Sub(prev); gap > silence {
			silence = gap
			resumed = a.At.Sub(r.at)
		}
		prev = a.At
	}
	if gap := end.Sub(prev); gap > consoleIdle {
		t.Errorf("%s: nothing delivered for the last %s (owner %q, status %q %q, %d upstream clients)",
			r.id, gap.Round(time.Millisecond), c.LeaseOwner, c.Status, c.StatusError, f.up.Stats(r.id).Clients)
		return fmt.Sprintf("not streaming at the end (silent %s)", gap.Round(time.Millisecond))
	}
	if silence > consoleIdle && resumed > r.bound {
		t.Errorf("%s: streaming again %s after the edit, bound %s (silent %s)", r.id, resumed.Round(time.Millisecond), r.bound,
			silence.Round(time.Millisecond))
	}
	switch st := f.up.Stats(r.id); {
	case st.Clients != 1:
		t.Errorf("%s: %d upstream clients at the end", r.id, st.Clients)
	case !c.Owned() || !live[c.LeaseOwner]:
		t.Errorf("%s: owner %q (live: %v), expiry %d at the end", r.id, c.LeaseOwner, live[c.LeaseOwner], c.LeaseExpiresAtMs)
	}
	if silence <= consoleIdle {
		return fmt.Sprintf("no pause (longest silence %d ms)", silence.Milliseconds())
	}
	return fmt.Sprintf("streaming again after %d ms", resumed.Milliseconds())
}

// invalidRow checks that r's connection, made unusable, stopped with status invalid
// naming the field, after at most one acquire.
func invalidRow(t *testing.T, f *testFleet, r *consoleRow, c codec.Connection, acquired int) string {
	t.Helper()
	if c.Status != "invalid" || !strings.Contains(c.StatusError, r.field) {
		t.Errorf("%s: status %q %q, want invalid naming %s", r.id, c.Status, c.StatusError, r.field)
	}
	if acquired > 1 {
		t.Errorf("%s: acquired %d times after the edit, want at most 1", r.id, acquired)
	}
	if n := f.up.Stats(r.id).Clients; n != 0 {
		t.Errorf("%s: %d upstream clients, want 0", r.id, n)
	}
	stopped := time.Duration(0)
	for _, e := range f.up.Events() {
		if e.Stream == r.id && e.Clients == 0 && e.Time.After(r.at) {
			stopped = e.Time.Sub(r.at)
			break
		}
	}
	return fmt.Sprintf("status %s after %d acquires; stopped %d ms after the edit", c.Status, acquired, stopped.Milliseconds())
}

var acquiredLine = regexp.MustCompile(`"msg":"acquired","conn":"([^"]+)"`)

// acquisitions counts the acquisitions of id in every worker's log so far.
func acquisitions(dir, id string) int {
	files, _ := filepath.Glob(filepath.Join(dir, "logs", "w*.log"))
	n := 0
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			continue
		}
		for _, m := range acquiredLine.FindAllSubmatch(b, -1) {
			if string(m[1]) == id {
				n++
			}
		}
	}
	return n
}
