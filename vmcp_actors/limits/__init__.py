"""Rate limits (token buckets, in memory or Redis) and backend bulkheads."""

from vmcp_actors.limits._bulkhead import Bulkheads, Place, QueueTimeout
from vmcp_actors.limits._buckets import Bucket, MemoryBuckets, RedisBuckets, StoreFailed
from vmcp_actors.limits._limiter import RATE_LIMITED, RateLimited, RateLimiter, user_of

__all__ = ["Bucket", "Bulkheads", "Place", "QueueTimeout", "MemoryBuckets", "RATE_LIMITED", "RateLimited", "RateLimiter", "RedisBuckets", "StoreFailed",
           "user_of"]
