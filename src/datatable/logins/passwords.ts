import { createHash, createHmac, pbkdf2, randomBytes } from 'node:crypto';
import { promisify } from 'node:util';

const pbkdf2Async = promisify(pbkdf2);
/**
 * PBKDF2 rounds in the verifiers of managed logins. Postgres's default (4096) exists to slow the
 * guessing of *human* passwords from a stolen verifier; managed passwords are 256-bit HMAC
 * outputs, which no number of guesses reaches, so the rounds would only tax every connection
 * (client side, ≈ 0.75 ms here) and every login created. Postgres 15+ accepts any count in a
 * verifier. What is traded: nothing for these passwords; never use this for a human one.
 */
const SCRAM_ITERATIONS = 16;

/**
 * Managed login passwords are never stored. Each login's catalog row holds a random nonce; the
 * password is HMAC-SHA-256(secretKey, label ‖ nonce). Without the secret key a database dump
 * yields nothing, and rotating a password is writing a new nonce.
 */
export class PasswordDeriver {
  readonly #key: Buffer;

  constructor(secretKey: string | Uint8Array) {
    const key =
      typeof secretKey === 'string' ? Buffer.from(secretKey, 'utf8') : Buffer.from(secretKey);
    if (key.byteLength < 32) {
      throw new TypeError(
        'secretKey must be at least 32 bytes (e.g. 64 hex characters from a secret store)',
      );
    }
    this.#key = key;
  }

  /** A fresh nonce for a login's catalog row. */
  static newNonce(): Buffer {
    return randomBytes(24);
  }

  /** The password of a role's own login; tied to its OID, so stable across renames. */
  forRole(oid: number, nonce: Uint8Array): string {
    return this.#derive(`role:${oid}`, nonce);
  }

  /** The password of set login `login`, from the nonce in its `role_set` row. */
  forSet(login: string, nonce: Uint8Array): string {
    return this.#derive(`set:${login}`, nonce);
  }

  /**
   * A key of its own for another use of the secret (`label` names the use; never a login's),
   * so no MAC made with it can ever be a password.
   */
  deriveKey(label: string): Buffer {
    return createHmac('sha256', this.#key).update(`key:${label}`).update('\0').digest();
  }

  #derive(label: string, nonce: Uint8Array): string {
    return createHmac('sha256', this.#key)
      .update(label)
      .update('\0')
      .update(nonce)
      .digest('base64url');
  }
}

/**
 * A SCRAM-SHA-256 verifier for `password`, as `CREATE ROLE … PASSWORD` accepts it. Sending the
 * verifier instead of the password keeps the password out of the server's statement log.
 */
export async function scramVerifier(password: string): Promise<string> {
  return verifierWithSalt(password, randomBytes(16), SCRAM_ITERATIONS);
}

/**
 * Whether `verifier` (a `pg_authid.rolpassword` value) was made from `password`. Costs one
 * PBKDF2 at the verifier's own iteration count; callers remember verifiers already checked.
 */
export async function verifierMatches(verifier: string, password: string): Promise<boolean> {
  const match = /^SCRAM-SHA-256\$(\d+):([A-Za-z0-9+/=]+)\$[A-Za-z0-9+/=]+:[A-Za-z0-9+/=]+$/.exec(
    verifier,
  );
  if (match === null) return false;
  const iterations = Number(match[1]);
  if (!Number.isSafeInteger(iterations) || iterations < 1 || iterations > 1_000_000) return false;
  const expected = await verifierWithSalt(password, Buffer.from(match[2]!, 'base64'), iterations);
  return expected === verifier;
}

async function verifierWithSalt(
  password: string,
  salt: Buffer,
  iterations: number,
): Promise<string> {
  const salted = await pbkdf2Async(password, salt, iterations, 32, 'sha256');
  const clientKey = createHmac('sha256', salted).update('Client Key').digest();
  const storedKey = createHash('sha256').update(clientKey).digest();
  const serverKey = createHmac('sha256', salted).update('Server Key').digest();
  return `SCRAM-SHA-256$${iterations}:${salt.toString('base64')}$${storedKey.toString('base64')}:${serverKey.toString('base64')}`;
}
