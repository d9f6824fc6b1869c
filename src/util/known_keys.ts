/**
 * Refuses an options object with a key the receiver does not know (`{ executor, stor }`): a
 * misspelt option would otherwise be ignored and its default used without a word. A
 * `TypeError` naming the key and the known ones, as every bad option is.
 */
export function checkKnownKeys(options: object, known: readonly string[], where: string): void {
  for (const key of Object.keys(options)) {
    if (!known.includes(key)) {
      throw new TypeError(
        `${where}: unknown option ${JSON.stringify(key)} (known: ${known.join(', ')})`,
      );
    }
  }
}
