package lockd_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/lockd-dev/lockd"
)

// An operator about to migrate the invoice database gives the invoice
// lock's holders a minute to finish: with the lock's revoke grace set, an
// admin's request is enforced (the holder's session is revoked when the
// minute ran out); anyone else's is only a request.
func ExampleClient_RequestRelease() {
	ctx := context.Background()
	client, err := lockd.New(lockd.WithEndpoints(endpoint))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(context.Background())
	if err := client.SetLockPolicy(ctx, "invoices/2025-03", lockd.LockPolicy{RevokeGrace: time.Minute}); err != nil {
		log.Fatal(err)
	}
	r, err := client.RequestRelease(ctx, "invoices/2025-03", "database migration at 02:00")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("asked %d holders; revoked after %v unless they let go\n", r.Holders, r.RevokeGrace)
}
