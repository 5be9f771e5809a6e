package soft

import (
	"fmt"

	"github.com/rsockio/rsock/verbs"
	"github.com/rsockio/rsock/verbs/internal/rc"
)

// Context is an open soft device. It implements [verbs.Context].
type Context struct {
	dev    *device
	refs   rc.Refs // PDs, CQs and completion channels
	events verbs.AsyncEventQueue
}

// Device returns the device's attributes.
func (c *Context) Device() verbs.DeviceAttr { return c.dev.attrCopy() }

// QueryPort returns the attributes of port num; soft devices have port 1 only.
func (c *Context) QueryPort(num uint8) (verbs.PortAttr, error) {
	if num != 1 {
		return verbs.PortAttr{}, fmt.Errorf("soft: query port %d: %w", num, verbs.ErrInvalidArgument)
	}
	return c.dev.attrCopy().Ports[0], nil
}

// AllocPD allocates a protection domain.
func (c *Context) AllocPD() (verbs.PD, error) {
	if err := c.dev.fab.injectedFailure(AllocPD); err != nil {
		return nil, fmt.Errorf("soft: alloc PD: %w", err)
	}
	if err := c.refs.Acquire(); err != nil {
		return nil, fmt.Errorf("soft: alloc PD: %w", err)
	}
	c.dev.fab.live.pds.Add(1)
	return &PD{ctx: c}, nil
}

// CreateCompChannel creates a completion channel.
func (c *Context) CreateCompChannel() (verbs.CompChannel, error) {
	if err := c.dev.fab.injectedFailure(AllocCompChannel); err != nil {
		return nil, fmt.Errorf("soft: create completion channel: %w", err)
	}
	if err := c.refs.Acquire(); err != nil {
		return nil, fmt.Errorf("soft: create completion channel: %w", err)
	}
	c.dev.fab.live.channels.Add(1)
	return newCompChannel(c), nil
}

// CreateCQ creates a CQ that holds exactly cqe completions. ch may be nil; otherwise it must
// be a channel of this context. vector must be below DeviceAttr.NumCompVectors.
func (c *Context) CreateCQ(cqe int, ch verbs.CompChannel, vector int) (verbs.CQ, error) {
	l := c.dev.limits()
	if err := provider.CheckCreateCQ(&l, cqe, vector); err != nil {
		return nil, err
	}
	var sch *CompChannel
	if ch != nil {
		var ok bool
		if sch, ok = ch.(*CompChannel); !ok || sch.ctx != c {
			return nil, fmt.Errorf("soft: create CQ: completion channel is not from this context: %w", verbs.ErrInvalidArgument)
		}
	}
	if err := c.dev.fab.injectedFailure(AllocCQ); err != nil {
		return nil, fmt.Errorf("soft: create CQ: %w", err)
	}
	if !reserve(&c.dev.nCQ, c.dev.attr.MaxCQ) {
		return nil, fmt.Errorf("soft: create CQ: device limit of %d CQs: %w", c.dev.attr.MaxCQ, verbs.ErrNoResources)
	}
	if err := c.refs.Acquire(); err != nil {
		c.dev.nCQ.Add(-1)
		return nil, fmt.Errorf("soft: create CQ: %w", err)
	}
	if sch != nil {
		if err := sch.core.Attach(); err != nil {
			c.refs.Release()
			c.dev.nCQ.Add(-1)
			return nil, fmt.Errorf("soft: create CQ: completion channel: %w", err)
		}
	}
	c.dev.fab.live.cqs.Add(1)
	return newCQ(c, cqe, sch), nil
}

// limits returns the device's capacities that the RC core's checks hold requests to.
func (d *device) limits() rc.Limits {
	return rc.Limits{
		MaxQPWR:   d.attr.MaxQPWR,
		MaxSGE:    d.attr.MaxSGE,
		MaxInline: d.attr.MaxInline,
		MaxCQE:    d.attr.MaxCQE,
		MaxMTU:    d.attr.Ports[0].MaxMTU,
		Vectors:   compVectors,
	}
}

// Close closes the context. PDs, CQs and channels created from it must be closed first.
func (c *Context) Close() error {
	if err := c.refs.Close(); err != nil {
		return fmt.Errorf("soft: close context: %w", err)
	}
	c.dev.events.remove(c)
	c.events.Close()
	c.dev.fab.live.contexts.Add(-1)
	return nil
}

// PD is a protection domain. It implements [verbs.PD]. MRs and QPs work together only when
// they belong to the same PD: a work request naming another PD's region fails with a
// protection error.
type PD struct {
	ctx  *Context
	refs rc.PD // MRs and QPs; the RC core names the PD by its address
}

// Close deallocates the protection domain. Its MRs and QPs must be closed first.
func (p *PD) Close() error {
	if err := p.refs.Close(); err != nil {
		return fmt.Errorf("soft: dealloc PD: %w", err)
	}
	p.ctx.refs.Release()
	p.ctx.dev.fab.live.pds.Add(-1)
	return nil
}
