package rc

import (
	"fmt"

	"github.com/rsockio/rsock/verbs"
)

// Provider names the provider the core serves in the errors the core returns, so that
// they carry the provider's layer ("soft: poll CQ: ...") as its own errors do. One value
// serves every object of the provider.
type Provider struct {
	name string

	// The errors Poll returns, made once so that a failing Poll allocates nothing.
	errPollClosed   error
	errPollOverflow error

	post PostErrors
}

// NewProvider returns the Provider named name ("soft", "shm").
func NewProvider(name string) *Provider {
	return &Provider{
		name:            name,
		errPollClosed:   fmt.Errorf("%s: poll CQ: %w", name, verbs.ErrClosed),
		errPollOverflow: fmt.Errorf("%s: poll CQ: %w", name, verbs.ErrCQOverflow),
		post:            newPostErrors(name),
	}
}

// Name returns the provider's name.
func (p *Provider) Name() string { return p.name }

// PostErrors returns the errors the provider's PostSend and PostRecv reject a work
// request with.
func (p *Provider) PostErrors() *PostErrors { return &p.post }
