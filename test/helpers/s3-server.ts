/**
 * A real S3-compatible server (Swift + s3api, scripts/s3-server.mjs) for tests: one per test file
 * (start it in beforeAll, stop it in afterAll), a bucket per test. `env` is what a memsnap CLI
 * process needs to reach it; pause()/resume() and kill()/restart() act on the proxy process for
 * fault tests.
 */
import { CreateBucketCommand, S3Client } from "@aws-sdk/client-s3";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startSwiftS3 } from "../../scripts/s3-server.mjs";

export interface S3Server {
  endpoint: string;
  /** Where the server keeps its configs, device and logs (*.log). */
  dir: string;
  /** AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, MEMSNAP_S3_ENDPOINT for a memsnap process. */
  env: Record<string, string>;
  /** An SDK client for the server (path-style, the test credentials). */
  client(): S3Client;
  createBucket(name: string): Promise<void>;
  /** SIGSTOP / SIGCONT the proxy: requests hang, then go on. */
  pause(): void;
  resume(): void;
  /** SIGKILL the proxy (connections reset, then refused); restart() brings it back on the same port. */
  kill(): Promise<void>;
  restart(): Promise<void>;
  /** Stop every server process and remove the directory. */
  stop(): Promise<void>;
}

interface Started {
  endpoint: string;
  dir: string;
  accessKeyId: string;
  secretAccessKey: string;
  region: string;
  stop(): Promise<void>;
  pause(): void;
  resume(): void;
  kill(): Promise<void>;
  restart(): Promise<void>;
}

export async function startS3Server(): Promise<S3Server> {
  // The SDK's notice that its 2027 releases need Node 22 (memsnap pins one that supports Node 20).
  process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= "true";
  const dir = mkdtempSync(join(tmpdir(), "memsnap-s3-"));
  let s: Started;
  try {
    s = (await startSwiftS3(dir)) as Started;
  } catch (e) {
    rmSync(dir, { recursive: true, force: true });
    throw e;
  }
  const env = {
    AWS_ACCESS_KEY_ID: s.accessKeyId,
    AWS_SECRET_ACCESS_KEY: s.secretAccessKey,
    AWS_REGION: s.region,
    MEMSNAP_S3_ENDPOINT: s.endpoint,
    AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: "true",
  };
  let client: S3Client | undefined;
  const getClient = (): S3Client =>
    (client ??= new S3Client({
      endpoint: s.endpoint, region: s.region, forcePathStyle: true,
      credentials: { accessKeyId: s.accessKeyId, secretAccessKey: s.secretAccessKey },
    }));
  return {
    endpoint: s.endpoint,
    dir,
    env,
    client: getClient,
    createBucket: async (name) => {
      await getClient().send(new CreateBucketCommand({ Bucket: name }));
    },
    pause: () => s.pause(),
    resume: () => s.resume(),
    kill: () => s.kill(),
    restart: () => s.restart(),
    stop: async () => {
      client?.destroy();
      await s.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
